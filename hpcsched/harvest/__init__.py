"""Idle-node harvesting replayed from logs (BFTrainer's semantics): the idle pool as events (``pool``), one
allocator decision per pool change (``replay``), a whole run from files (``run``) and ``hpcsched replay``
(``cli``). The live harvester of a real Slurm is ``hpcsched.slurm.harvester``; both decide with
``hpcsched.milp.allocate``'s solvers."""
