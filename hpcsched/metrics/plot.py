"""The JCT CDF plot of several runs (``hpcsched compare``, ``simulate`` of several policies)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from matplotlib.axes import Axes


def plot_jct_cdf(runs: Sequence[tuple[str, pd.DataFrame]], out_png: str | Path, subject: str | None = None) -> Path:
    """One JCT CDF per run on shared log-scaled axes, for comparing policies at a glance.

    ``subject`` names the trace and cluster (``runs_subject``); the title says so, because a CDF
    without them cannot be told from another trace's.
    """
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = [np.array([])]
    for label, df in runs:
        done = df[df["end"].notna()]
        jct = np.maximum(np.sort((done["end"] - done["submit"]).to_numpy(dtype=float)), 1e-3)
        if len(jct):
            ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", label=label)
            drawn.append(jct)
    log_x_by_decades(ax, np.concatenate(drawn))
    ax.set_xlabel("job completion time (s, log scale)")
    ax.set_ylabel("fraction of finished jobs")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title(f"JCT CDF: {subject or 'trace and cluster unknown'}", fontsize="medium")
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def log_x_by_decades(ax: Axes, values: np.ndarray) -> None:
    """A log x axis from a power of ten to a power of ten: labelled at both ends even for data inside one
    decade, where matplotlib would label crowded minor ticks instead. Here, not in ``hpcsched.report``, because
    the metrics' own plot uses it and the report is a floor above the metrics."""
    import math

    import numpy as np
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    pos = values[np.isfinite(values) & (values > 0)]
    if len(pos):
        lo, hi = math.floor(math.log10(pos.min())), math.ceil(math.log10(pos.max()))
        ax.set_xlim(10.0 ** lo, 10.0 ** max(hi, lo + 1))
    ax.xaxis.set_minor_formatter(NullFormatter())
