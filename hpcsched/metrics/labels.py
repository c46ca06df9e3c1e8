"""Labels and titles for runs shown side by side: what tells two runs of one policy apart, what they ran on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_LABEL_KEYS = ("trace", "cluster", "compat", "arrival_scale", "restart_s", "jobs_file", "tfwd", "objective",
               "accounting", "max_jobs", "time_limit", "predict_tfwd", "exact_events", "seed")
_PATH_KEYS = ("trace", "cluster", "jobs_file", "dir")


def _stem(value: object) -> str:
    name = str(value).rstrip("/").rsplit("/", 1)[-1]
    for suffix in (".gz", ".csv", ".swf", ".yaml", ".yml"):
        name = name.removesuffix(suffix)
    return name


def _label_bit(key: str, value: object) -> str:
    if key in ("trace", "cluster"):
        return _stem(value) if value is not None else f"{key} unknown"
    if key in _PATH_KEYS:
        return f"{key}={_stem(value)}"
    if key == "compat" and value is None:
        return "compat=default"
    return f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"


def run_labels(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """One label per run, distinct wherever runs share a policy name.

    ``runs`` are meta.json mappings, each with ``dir`` where known. A run is labelled by its policy
    (else its directory's name); runs sharing one get, in brackets, the facts that differ between them
    (trace, cluster, compat mode, a parameter), else their directory names, else a number, so three
    replays of ``bftrainer-highs`` in one table or legend are never three identical columns or lines.
    """
    base = [str(r.get("policy") or _stem(r.get("dir") or "") or f"run {i + 1}") for i, r in enumerate(runs)]
    labels = list(base)
    groups: dict[str, list[int]] = {}
    for i, b in enumerate(base):
        groups.setdefault(b, []).append(i)
    for b, idx in groups.items():
        if len(idx) < 2:
            continue
        bits: dict[int, list[str]] = {i: [] for i in idx}
        for key in _LABEL_KEYS:
            values = [_label_bit(key, runs[i].get(key)) for i in idx]
            if len(set(values)) > 1:
                for i, v in zip(idx, values, strict=True):
                    bits[i].append(v)
                if _distinct(bits):
                    break
        if not _distinct(bits):  # the same run twice, or facts meta.json does not hold: fall back to the folder
            dirs = [str(runs[i].get("dir") or "") for i in idx]
            names = [_stem(d) for d in dirs]
            for i, name, d in zip(idx, names, dirs, strict=True):
                bits[i].append(name if len(set(names)) == len(names) else d)
        if not _distinct(bits):
            for k, i in enumerate(idx):
                bits[i].append(f"#{k + 1}")
        for i in idx:
            labels[i] = f"{b} ({', '.join(x for x in bits[i] if x)})"
    return labels


def _distinct(bits: Mapping[int, list[str]]) -> bool:
    return len({tuple(b) for b in bits.values()}) == len(bits)


def _names(values: Sequence[str], most: int = 4) -> str:
    unique = list(dict.fromkeys(values))
    if len(unique) <= most:
        return ", ".join(unique)
    return f"{', '.join(unique[:most - 1])} and {len(unique) - most + 1} more"


def runs_subject(runs: Sequence[Mapping[str, Any]]) -> str:
    """'trace3 on n8g8 (64 GPUs), compat=muri': what a set of runs ran on, for plot and table titles.

    A reader of a figure cut out of its context must still see which trace and cluster it shows; a
    fact meta.json does not hold is written as unknown rather than left out.
    """
    traces = _names([_stem(r["trace"]) if r.get("trace") else "trace unknown" for r in runs])
    clusters = []
    for r in runs:
        name = str(r.get("cluster") or "cluster unknown")
        gpus = r.get("capacity_gpus")
        clusters.append(f"{name} ({gpus} GPUs)" if gpus and "GPU" not in name else name)
    text = f"{traces} on {_names(clusters)}"
    if any(r.get("compat") for r in runs):  # the default mode is named only beside another one
        text += f", compat={'/'.join(dict.fromkeys(str(r.get('compat') or 'default') for r in runs))}"
    return text
