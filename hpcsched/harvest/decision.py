"""One replay decision's job counts from the allocator, with the runtime controller's no-pause rule where asked:
what the replayer caches by (who holds how many, pool size, Tfwd) and reuses."""

from __future__ import annotations

from hpcsched.harvest.replay_config import ReplayConfig
from hpcsched.milp import MilpJob
from hpcsched.milp.allocate import solve_counts_sized

Answer = tuple[list[int], str, int]  # (counts per job, solver status, jobs held at their minimum)


def solve_decision(states: tuple[MilpJob, ...], pool_size: int, tfwd: float, cfg: ReplayConfig) -> Answer:
    """The allocator's counts for ``states`` on ``pool_size`` idle nodes; with ``cfg.no_pause`` the controller's
    rule over them (``held_at_minimum``)."""
    counts, status, _ = solve_counts_sized(states, pool_size, tfwd, cfg.objective, cfg.solver, cfg.time_limit,
                                           unique_shortcut=True)
    if cfg.no_pause:
        return held_at_minimum(states, counts, status, tfwd, cfg, pool_size)
    return counts, status, 0


def held_at_minimum(states: tuple[MilpJob, ...], counts: list[int], status: str, tfwd: float, cfg: ReplayConfig,
                    pool_size: int) -> Answer:
    """``no_pause``: the controller's rule over the allocator's answer ``counts`` (ReplayConfig); also how many
    jobs it held at their minimum."""
    left = pool_size
    sizes: dict[int, int] = {}
    for i, st in enumerate(states):  # admitted at their minimum, first come first served
        if st.job.jmin <= left:
            sizes[i] = st.job.jmin
            left -= st.job.jmin
    free = list(sizes)
    if len(free) == len(states) and all(c >= st.job.jmin for c, st in zip(counts, states, strict=True)):
        return counts, status, 0  # nothing paused: the allocator's answer stands
    held = 0
    while free:
        pool_n = left + sum(sizes[i] for i in free)
        sub, status, _ = solve_counts_sized(tuple(states[i] for i in free), pool_n, tfwd, cfg.objective,
                                            cfg.solver, cfg.time_limit, unique_shortcut=True)
        paused = [i for i, c in zip(free, sub, strict=True) if c < sizes[i]]
        if not paused:
            sizes.update(zip(free, sub, strict=True))
            break
        held += len(paused)
        free = [i for i in free if i not in paused]  # held at their minimum; the others sized again
    return [sizes.get(i, 0) for i in range(len(states))], status, held
