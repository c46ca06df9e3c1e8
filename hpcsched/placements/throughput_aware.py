"""Throughput-aware placement (Gavel's heterogeneity awareness, as a placement step): a unit goes on the GPU type
that trains its model fastest, by the throughput table Gavel measured and hpcsched ships
(``hpcsched.hetero.throughputs``; ``v100``, ``p100``, ``k80``).

Why: the same job runs at very different speeds on different types, and not always fastest on the newest one:
ResNet-50 (batch 64) makes 4.4 steps/s on a V100, 2.6 on a P100 and 0.6 on a K80, but Recommendation (batch 512)
makes 48.9 on a P100, 32.9 on a K80 and only 23.3 on a V100. First fit puts a job on whatever worker comes first.

Rule: the candidates' GPU types that the table knows for the unit's model (``PlacementView.model``, the job
file's ``model:``, matched ignoring case and spacing) are tried fastest first (steps/s on one GPU of the type;
ties in worker order), the unit placed consolidated over that type's workers alone, so a unit does not mix types
(the slowest type would pace every rank). If no single known type holds it, or the model or every candidate's
type is unknown to the table, it is placed as ``consolidated`` over all the candidates: this step never makes a
unit wait that ``consolidated`` would place.
"""

from __future__ import annotations

import functools
import re

from hpcsched.placements import PlacementView, register
from hpcsched.primitives.placement import place_consolidated


@functools.lru_cache(maxsize=1)
def _rates() -> dict[str, dict[str, float]]:
    """{normalised model name: {GPU type: steps/s on one GPU}} from the shipped table, read once (a broken
    install raises the table's InputError naming the file: it is not degraded to first fit silently)."""
    from hpcsched.hetero.throughputs import load_throughputs

    table = load_throughputs()
    out: dict[str, dict[str, float]] = {}
    for gpu_type, rates in table.isolated_rates.items():
        for (job_type, scale), rate in rates.items():
            if scale == 1:
                out.setdefault(_norm(job_type), {})[gpu_type] = rate
    return out


def _norm(name: str) -> str:
    return re.sub(r"\s+", " ", name).strip().lower()


def model_rates(model: str | None) -> dict[str, float]:
    """Steps/s on one GPU of each type the table has for ``model`` ({} when it has none): what this step ranks
    types by, public so a user can see what a job file's ``model:`` will be matched to."""
    return dict(_rates().get(_norm(model), {})) if model else {}


@register("throughput-aware")
def throughput_aware(view: PlacementView) -> list[tuple[int, int]] | None:
    free = [max(0, f) for f in view.free]
    rates = model_rates(view.model)
    types = view.gpu_types[: len(free)]
    known = sorted({t for t in types if t in rates}, key=lambda t: (-rates[t], types.index(t)))
    for t in known:  # fastest type first, each on its own
        got = place_consolidated([f if types[i] == t else 0 for i, f in enumerate(free)], view.need,
                                 view.slots_per_node)
        if got is not None:
            return got
    return place_consolidated(free, view.need, view.slots_per_node)
