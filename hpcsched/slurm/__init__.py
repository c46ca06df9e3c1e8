"""Live Slurm integration: harvest the nodes a real Slurm leaves idle, give them back when it wants them.

- ``nodes``: Slurm node states -> harvestable or not (one table, one place).
- ``source``: polls ``sinfo``/``squeue`` and turns changes of the harvestable pool into join/leave
  events, the same kind of events the idle-node replayer feeds the allocator.
- ``scavenger``: mode (a), elastic jobs run as preemptible Slurm jobs in the ``scavenger`` partition.
- ``local``: mode (b), elastic jobs run as our own processes on nodes Slurm reports idle.
- ``harvester``: the loop joining a source, ``hpcsched.milp.allocate`` and an executor (modes a and b).
- ``controller_mode``: the default mode: a harvest config run by the runtime's controller on pilot workers.
- ``record``: the per-event CSV log and the jobs.csv/meta.json that ``hpcsched calc`` reads.
"""
