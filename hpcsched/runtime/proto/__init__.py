"""The runtime's gRPC contract. The ``*_pb2*.py`` stubs are generated (``make rpc``), never committed."""
