"""The real-cluster executor: a controller (scheduler + state) and worker daemons speaking gRPC.

The controller decides with the same policies the simulator uses (``hpcsched.policies``) and keeps
every job, allocation, progress report and checkpoint in SQLite (WAL), so ``kill -9`` loses nothing.
Workers pull orders from heartbeat replies and launch real training programs through ``torchrun``,
``mpirun`` or ``horovodrun``.
"""
