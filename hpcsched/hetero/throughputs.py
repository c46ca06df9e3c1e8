"""Gavel's throughput table: steps/s of each job type on each GPU type, alone and co-located with another.

The heterogeneity-aware policies need a job's speed on every GPU type (and, for space sharing, the pair's
speeds when two jobs share a GPU); Gavel measured them and ships them as ``simulation_throughputs.json``
(bundled as ``hpcsched/hetero/simulation_throughputs.json.gz``, MIT; see trace-data/SOURCES.md).
Layout of that JSON::

    {gpu_type: {"('ResNet-18 (batch size 16)', 1)": {"null": steps/s alone,
                                                     "('A3C', 1)": [steps/s of this job, of the other], ...}}}

The key is the Python ``str`` of a ``(job type, scale factor)`` tuple; ``null`` is the isolated throughput
and each other key a co-location partner. GPU types are lower case (``v100``, ``p100``, ``k80``, and
``*_unconsolidated`` for multi-GPU jobs spread over servers).
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpcsched.errors import InputError

# Beside this module, not in trace-data/: every file there is read as a trace by the real-trace tests.
BUNDLED = Path(__file__).resolve().parent / "simulation_throughputs.json.gz"
ISOLATED = BUNDLED.with_name("simulation_throughputs.isolated.json.gz")
"""The bundled table's isolated rates alone, derived from ``BUNDLED`` by ``write_isolated`` (and checked
against it by a test): reading them takes ~1 ms where the whole table's JSON takes ~8 ms, and every
``simulate --compat gavel`` run reads the table while only space sharing needs the pairs."""
_KEY = re.compile(r"""\(\s*(['"])(?P<type>.*)\1\s*,\s*(?P<scale>\d+)\s*\)""")

JobKey = tuple[str, int]  # (job type, scale factor)


def parse_key(text: str) -> JobKey:
    """``"('ResNet-18 (batch size 16)', 1)"`` -> ``('ResNet-18 (batch size 16)', 1)``; ValueError otherwise."""
    m = _KEY.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"not a (job type, scale factor) key: {text!r}")
    return m.group("type"), int(m.group("scale"))


@dataclass(frozen=True)
class ThroughputTable:
    """Steps/s per (GPU type, job type, scale factor), isolated and per co-located pair.

    Lookups raise KeyError naming what the table lacks and what it has, because a misspelt job type
    would otherwise surface as a bare KeyError deep inside a policy.
    """

    isolated_rates: Mapping[str, Mapping[JobKey, float]]
    colocated_rates: Mapping[str, Mapping[tuple[JobKey, JobKey], tuple[float, float]]] = field(repr=False)
    source: str = ""

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(self.isolated_rates)

    def job_types(self, gpu_type: str = "v100") -> tuple[str, ...]:
        """Job types (scale factor 1) the table has for ``gpu_type``, in the file's order."""
        return tuple(t for t, s in self._rates(gpu_type) if s == 1)

    def scale_factors(self, job_type: str, gpu_type: str = "v100") -> tuple[int, ...]:
        return tuple(s for t, s in self._rates(gpu_type) if t == job_type)

    def isolated(self, job_type: str, gpu_type: str, scale_factor: int = 1) -> float:
        """Steps/s of ``job_type`` at ``scale_factor`` GPUs of ``gpu_type``, alone on them."""
        rates = self._rates(gpu_type)
        try:
            return rates[(job_type, scale_factor)]
        except KeyError:
            raise KeyError(self._missing(job_type, scale_factor, gpu_type)) from None

    def colocated(self, job_type_a: str, job_type_b: str, gpu_type: str, scale_factor: int = 1) -> tuple[float, float]:
        """(steps/s of a, steps/s of b) when a and b share the same ``gpu_type`` GPU(s)."""
        pairs = self.colocated_rates.get(gpu_type)
        if pairs is None:
            raise KeyError(f"GPU type {gpu_type!r} not in the throughput table (it has {', '.join(self.gpu_types)})")
        key = ((job_type_a, scale_factor), (job_type_b, scale_factor))
        try:
            return pairs[key]
        except KeyError:
            for jt in (job_type_a, job_type_b):
                if (jt, scale_factor) not in self.isolated_rates[gpu_type]:
                    raise KeyError(self._missing(jt, scale_factor, gpu_type)) from None
            raise KeyError(f"no co-located throughput for {job_type_a!r} with {job_type_b!r} "
                           f"(scale factor {scale_factor}) on {gpu_type!r}") from None

    def _rates(self, gpu_type: str) -> Mapping[JobKey, float]:
        rates = self.isolated_rates.get(gpu_type)
        if rates is None:
            raise KeyError(f"GPU type {gpu_type!r} not in the throughput table (it has {', '.join(self.gpu_types)})")
        return rates

    def _missing(self, job_type: str, scale_factor: int, gpu_type: str) -> str:
        rates = self.isolated_rates[gpu_type]
        if any(t == job_type for t, _ in rates):
            have = ", ".join(str(s) for s in self.scale_factors(job_type, gpu_type))
            return f"job type {job_type!r} has no scale factor {scale_factor} on {gpu_type!r} (it has {have})"
        return f"job type {job_type!r} not in the throughput table for {gpu_type!r} (it has {len(rates)} types, " \
               f"e.g. {', '.join(repr(t) for t in self.job_types(gpu_type)[:3])})"


def load_throughputs(path: str | Path = BUNDLED) -> ThroughputTable:
    """Read Gavel's throughput JSON (``.gz`` or plain); a malformed file is an InputError naming the bad key.

    The bundled table's isolated rates come from ``ISOLATED`` when it was derived from this very file (same
    size and CRC-32); its pairs, and any other file, from the JSON itself."""
    p = Path(path)
    if p == BUNDLED:
        table = _bundled_isolated()
        if table is not None:
            return table
    return _parse_table(_read_json(p), p)


def _parse_table(data: object, p: Path) -> ThroughputTable:
    """The table in Gavel's JSON ``data`` (read from ``p``), its isolated rates checked; pairs parsed lazily."""
    if not isinstance(data, dict) or not data:
        raise InputError(p, "not a Gavel throughput JSON: expected an object of GPU types")
    isolated: dict[str, dict[JobKey, float]] = {}
    for gpu_type, jobs in data.items():
        if not isinstance(jobs, dict):
            raise InputError(p, f"{gpu_type}: expected an object of job types")
        iso = isolated[gpu_type] = {}
        for key_text, entry in jobs.items():
            try:
                key = parse_key(key_text)
                if not isinstance(entry, dict) or "null" not in entry:
                    raise ValueError("no isolated ('null') throughput")
                iso[key] = float(entry["null"])
            except (ValueError, TypeError) as e:
                raise InputError(p, f"{gpu_type} / {key_text}: {e}") from None
    return ThroughputTable(isolated, _LazyPairs(lambda: data, p), str(p))


def _read_json(p: Path) -> dict:
    """The JSON in ``p`` (gzipped or plain); InputError naming the file when it cannot be read."""
    try:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return json.loads(raw)
    except FileNotFoundError:
        raise InputError(p, "no such throughput file") from None
    except (OSError, EOFError, ValueError) as e:
        raise InputError(p, f"not a Gavel throughput JSON: {e}") from None


def _fingerprint(raw: bytes) -> list[int]:
    import zlib

    return [len(raw), zlib.crc32(raw)]


def _bundled_isolated() -> ThroughputTable | None:
    """The bundled table with its isolated rates read from ``ISOLATED``; None when that file is missing or was
    derived from another version of ``BUNDLED`` (the caller then reads the whole JSON: same table, slower)."""
    try:
        compact = json.loads(gzip.decompress(ISOLATED.read_bytes()))
        if compact.get("source") != _fingerprint(BUNDLED.read_bytes()):
            return None
        isolated = {gpu: {(t, int(sf)): float(r) for t, sf, r in rows} for gpu, rows in compact["isolated"].items()}
    except (OSError, EOFError, ValueError, KeyError, TypeError):
        return None
    return ThroughputTable(isolated, _LazyPairs(lambda: _read_json(BUNDLED), BUNDLED), str(BUNDLED))


def write_isolated(path: Path = ISOLATED) -> None:
    """Derive ``ISOLATED`` from ``BUNDLED`` (run after replacing the bundled table:
    ``python -c "from hpcsched.hetero.throughputs import write_isolated; write_isolated()"``)."""
    table = _parse_table(_read_json(BUNDLED), BUNDLED)
    rows = {gpu: [[t, sf, r] for (t, sf), r in rates.items()] for gpu, rates in table.isolated_rates.items()}
    text = json.dumps({"source": _fingerprint(BUNDLED.read_bytes()), "isolated": rows}, separators=(",", ":"))
    path.write_bytes(gzip.compress(text.encode(), mtime=0))


class _LazyPairs(Mapping[str, Mapping[tuple[JobKey, JobKey], tuple[float, float]]]):
    """The co-located rates of each GPU type, parsed (and checked) the first time that type is asked for.

    Why lazy: the table has ~10,000 pair entries and only space sharing reads them; parsing them all cost
    every ``simulate --compat gavel`` run a third of its start-up. A malformed pair is still an InputError
    naming the file and key, raised by the first lookup that reaches it.
    """

    def __init__(self, data: Callable[[], dict[str, dict]], path: Path) -> None:
        self._load, self._path = data, path  # the JSON, read on first use (the bundled table's pairs: lazily)
        self._json: dict[str, dict] | None = None
        self._parsed: dict[str, dict[tuple[JobKey, JobKey], tuple[float, float]]] = {}

    @property
    def _data(self) -> dict[str, dict]:
        if self._json is None:
            self._json = self._load()
        return self._json

    def __getitem__(self, gpu_type: str) -> Mapping[tuple[JobKey, JobKey], tuple[float, float]]:
        col = self._parsed.get(gpu_type)
        if col is None:
            col = {}
            for key_text, entry in self._data[gpu_type].items():  # KeyError: not a GPU type, as a dict
                key = parse_key(key_text)  # checked when the table was loaded
                for other_text, pair in entry.items():
                    if other_text == "null":
                        continue
                    try:
                        if not (isinstance(pair, list) and len(pair) == 2):
                            raise ValueError(f"{other_text}: expected [steps/s of this job, of the other]")
                        col[(key, parse_key(other_text))] = (float(pair[0]), float(pair[1]))
                    except (ValueError, TypeError) as e:
                        raise InputError(self._path, f"{gpu_type} / {key_text}: {e}") from None
            self._parsed[gpu_type] = col
        return col

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)
