"""Load-based admission (Blox's ``loadBasedAccept``): new jobs enter the queue, oldest first, only while the
GPU demand of the admitted jobs stays within ``load_threshold`` x the cluster's slots; the rest wait outside,
so a burst of arrivals cannot flood the policy's queue (and, for LAS-like policies, starve the admitted jobs).

Admitted = running, or started before (a job once admitted stays so). Blox checks the threshold before adding
each job, so the job that crosses it is still admitted (and a job larger than the threshold is not held for
ever: it enters once nothing is admitted); the first job held holds every later one (a FIFO queue). The
demand counted is a running job's size and a waiting job's minimum.
"""

from __future__ import annotations

from hpcsched.admission import AdmissionView, register


@register("load-based")
def load_based(view: AdmissionView) -> dict[str, str]:
    limit = view.load_threshold * view.capacity
    demand = sum(j.procs if j.running else j.min_procs for j in view.jobs if j.running or j.first_start is not None)
    held: dict[str, str] = {}
    for j in sorted((j for j in view.jobs if not j.running and j.first_start is None), key=lambda j: (j.submit, j.id)):
        if held or demand > limit:
            held[j.id] = (f"held by load-based admission: admitted jobs ask {demand:g} slots, over "
                          f"{view.load_threshold:g} x {view.capacity} ({limit:g})")
            continue
        demand += j.min_procs
    return held
