"""The decision core shared by the executors: ``decide(request) -> Plan`` (``hpcsched.core.decide``)."""
