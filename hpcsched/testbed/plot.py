"""The sim-vs-real comparison as one figure: where a table of 24 per-job errors is hard to read, a scatter
against the diagonal shows at a glance which simulation tracks the real run and which jobs it misses."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def plot_comparison(comparisons: Mapping[str, Mapping[str, Any]], out_png: Path) -> Path:
    """Left: each job's simulated vs real JCT per simulation (log axes, the diagonal and a +-10% band).
    Right: seconds per iteration by interleaved group size, measured and as each simulation assumed.
    ``comparisons`` maps a simulation's name to ``compare.compare_runs``' result (``comparison.json``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    lo, hi = float("inf"), 0.0
    for name, c in comparisons.items():
        pairs = [(j["real_jct"], j["sim_jct"]) for j in c.get("jobs", ())
                 if j.get("real_jct") and j.get("sim_jct")]
        if not pairs:
            continue
        real, sim = zip(*pairs, strict=True)
        err = (c.get("summary", {}).get("avg JCT") or {}).get("error")
        label = name if err is None else f"{name} (avg JCT {err:+.1%})"
        left.scatter(real, sim, s=18, alpha=0.75, label=label)
        lo, hi = min(lo, *real, *sim), max(hi, *real, *sim)
    if hi > 0:
        xs = [lo * 0.8, hi * 1.25]
        left.plot(xs, xs, color="black", lw=0.8)
        left.fill_between(xs, [x * 0.9 for x in xs], [x * 1.1 for x in xs], color="grey", alpha=0.2, label="+-10%")
        left.set_xscale("log")
        left.set_yscale("log")
        left.legend(fontsize=8)
    left.set_xlabel("real JCT (trace s)")
    left.set_ylabel("simulated JCT (trace s)")
    left.set_title("per job")

    sizes = sorted({g["group_size"] for c in comparisons.values() for g in c.get("groups", ())})
    if sizes:
        measured = {g["group_size"]: g["measured_s"] for c in comparisons.values() for g in c.get("groups", ())}
        names = [n for n, c in comparisons.items() if c.get("groups")]
        width = 0.8 / (len(names) + 1)
        xs = range(len(sizes))
        right.bar([x - 0.4 + width / 2 for x in xs], [measured[k] for k in sizes], width, label="measured",
                  color="black")
        for i, name in enumerate(names):
            by = {g["group_size"]: g.get("sim_s") for g in comparisons[name]["groups"]}
            right.bar([x - 0.4 + width * (i + 1.5) for x in xs], [by.get(k) or 0.0 for k in sizes], width, label=name)
        right.set_xticks(list(xs), ["solo" if k == 1 else str(k) for k in sizes])
        right.set_xlabel("jobs interleaved on the same slots")
        right.set_ylabel("seconds per iteration (trace scale)")
        right.set_title("pace by group size (median over report windows)")
        right.legend(fontsize=8)
    else:
        right.set_axis_off()
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
