"""CLI start-up (issue 14): `hpcsched --help` and a command's import path stay free of heavy modules.

Nothing here is timed (timings belong to bench/bench_startup.py); the tests check which modules a path
imports, that the lazily loaded CLI is the same CLI as one built by importing every area up front, and that
`hpcsched simulate`, which no longer imports pandas, still writes and prints exactly what it did with pandas.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import os
import random
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from hpcsched import cli

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "matplotlib", "grpc", "highspy", "networkx", "rustworkx", "yaml", "numpy", "scipy")

# What `python -c _PROBE ARGS` prints: the heavy modules loaded after running the CLI with ARGS (exit caught).
_PROBE = """
import json, sys
from hpcsched.cli import main
sys.argv = ["hpcsched", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))
""".replace("HEAVY", repr(HEAVY))


def _heavy_after(*args: str) -> list[str]:
    p = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "COLUMNS": "100"}, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_import_cli_loads_nothing_heavy() -> None:
    code = f"import hpcsched.cli, sys; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_help_loads_nothing_heavy() -> None:
    assert _heavy_after("--help") == []
    assert _heavy_after() == []  # no arguments prints the same help


@pytest.mark.parametrize("args", [("simulate", "--help"), ("compare", "--help"), ("calc", "--help"),
                                  ("sweep", "--help"), ("report", "--help"), ("testbed", "--help"),
                                  ("controller", "--help"), ("submit", "--help"), ("slurm", "--help"),
                                  ("trace", "inspect", "--help")])
def test_command_help_loads_no_pandas_or_plots(args: tuple[str, ...]) -> None:
    """A command's help imports its own module only; those import their heavy modules inside the commands.

    (``trace`` needs yaml through the Muri reader's cluster specs; ``replay`` is left out: its options
    list the MILP's solvers and accounting modes, whose modules import numpy and pandas.)
    """
    heavy = set(_heavy_after(*args)) - ({"yaml"} if args[0] == "trace" else set())
    assert heavy == set(), heavy


def test_command_table_matches_what_modules_register() -> None:
    """``cli.COMMANDS`` (what `hpcsched --help` lists without importing) = what the modules define."""
    eager = typer.Typer(add_completion=False)
    for module in cli.COMMAND_MODULES:
        importlib.import_module(module).register(eager)
    real = typer.main.get_group(eager).commands
    assert list(real) == list(cli.COMMANDS), "update hpcsched.cli.COMMANDS: names or order differ"
    for name, cmd in real.items():
        summary = inspect.cleandoc(cmd.short_help or cmd.help or "").split("\n\n")[0].strip()
        assert cli.COMMANDS[name][1] == summary, f"update hpcsched.cli.COMMANDS[{name!r}] to its help's first paragraph"
        assert name in cli.load_commands(cli.COMMANDS[name][0]), f"{name} is not defined by {cli.COMMANDS[name][0]}"


def _eager_app() -> typer.Typer:
    """The CLI as it was built before issue 14: every area's module imported and registered up front."""
    app = typer.Typer(name="hpcsched", help=cli.app.info.help, no_args_is_help=True, pretty_exceptions_enable=False,
                      add_completion=False)
    for module in cli.COMMAND_MODULES:
        importlib.import_module(module).register(app)
    return app


@pytest.mark.parametrize("args", [[], ["--help"], ["simulat"], ["trace"], ["slurm"],
                                  *([c, "--help"] for c in cli.COMMANDS),
                                  ["trace", "inspect", "--help"], ["slurm", "harvest", "--help"],
                                  ["replay", "--idle", "a", "--jobs", "b", "--curves", "c", "--out", "d",
                                   "--objective", "nope"]])
def test_lazy_cli_prints_what_the_eager_one_did(args: list[str]) -> None:
    """Same help, usage errors and exit codes, command by command, as the app that imported everything."""
    env = {"COLUMNS": "100", "TERM": "dumb"}
    lazy = CliRunner().invoke(cli.app, args, env=env, prog_name="hpcsched")
    eager = CliRunner().invoke(_eager_app(), args, env=env, prog_name="hpcsched")
    assert (lazy.exit_code, lazy.output) == (eager.exit_code, eager.output)


# -- `hpcsched simulate` without pandas ------------------------------------------------------------------------
# simulate writes its files with the csv module and summarises its run from the job records (issue 14: pandas'
# import was the largest part of its start-up). What it writes and prints must stay what pandas and numpy gave,
# byte for byte and bit for bit; the pandas/numpy versions below are the code these paths replaced.

_NOT_ON_SIMULATE = {"pandas", "matplotlib", "scipy", "networkx", "grpc", "highspy"}  # numpy, yaml, rustworkx: not yet


def test_simulate_modules_import_no_pandas() -> None:
    code = ("import sys, hpcsched.sim.cli, hpcsched.sim.runs, hpcsched.sim.engine, hpcsched.metrics, "
            "hpcsched.results, hpcsched.cluster_spec, hpcsched.traces, hpcsched.policies; "
            f"print(sorted(m for m in {sorted(_NOT_ON_SIMULATE)!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("extra", [(), ("--json",)])
def test_simulate_run_loads_no_pandas(tmp_path: Path, extra: tuple[str, ...]) -> None:
    heavy = _heavy_after("simulate", "--trace", str(ROOT / "trace-data/muri/trace3.csv"), "--cluster",
                         str(ROOT / "cluster_spec/n8g8.csv"), "--policy", "srsf", "--compat", "muri",
                         "--out", str(tmp_path / "run"), *extra)
    assert set(heavy) & _NOT_ON_SIMULATE == set(), heavy
    assert (tmp_path / "run" / "timeline.csv").is_file()


def _pandas_summary(df: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """``hpcsched.metrics.summarize`` as it was computed with pandas and numpy (the oracle)."""
    import numpy as np
    import pandas as pd

    done = df[df["end"].notna()]
    jct = np.sort((done["end"] - done["submit"]).to_numpy(dtype=float))
    n = len(jct)
    out: dict[str, Any] = {"jobs": int(len(done)), "unfinished": int(len(df) - len(done))}
    if n:
        out |= {"avg_jct": float(jct.mean()), "p50_jct": float(np.median(jct)),
                "p95_jct": float(jct[min(int(0.95 * n), n - 1)]), "p99_jct": float(jct[min(int(0.99 * n), n - 1)]),
                "p99_jct_interp": float(np.percentile(jct, 99)), "max_jct": float(jct[-1])}
    else:
        out |= dict.fromkeys(("avg_jct", "p50_jct", "p95_jct", "p99_jct", "p99_jct_interp", "max_jct"))
    started = df[df["start"].notna()]
    out["avg_queue"] = float((started["start"] - started["submit"]).mean()) if len(started) else None
    last_end = float(done["end"].max()) if len(done) else None
    first_submit = float(df["submit"].min()) if len(df) else None
    span = last_end - first_submit if last_end is not None and first_submit is not None else None
    out |= {"makespan": span, "span": span, "first_submit": first_submit, "last_end": last_end}
    util = None
    if meta.get("capacity_node_seconds"):
        util = float(df.get("node_seconds", pd.Series(dtype=float)).sum()) / float(meta["capacity_node_seconds"])
    elif span:
        for held, cap, size in (("gpu_seconds", "capacity_gpus", "gpus"), ("node_seconds", "capacity_nodes", "nodes")):
            capacity = meta.get(cap)
            if capacity and held in df.columns and df[held].sum() > 0:
                util = float(df[held].sum()) / (float(capacity) * span)
                break
            if capacity and size in df.columns and df[size].sum() > 0:
                ran = df[df["end"].notna() & df["start"].notna()]
                util = float((ran[size] * (ran["end"] - ran["start"])).sum()) / (float(capacity) * span)
                break
    out["utilization"] = util
    return out | {k: meta[k] for k in ("policy", "trace", "cluster", "tool", "harvested_node_hours", "preemptions",
                                       "max_lost_steps") if k in meta}


def _same_bits(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal keys in order and equal values, floats to the last bit (NaN equal to NaN)."""
    if list(a) != list(b):
        return False
    for x, y in zip(a.values(), b.values(), strict=True):
        if isinstance(x, float) and isinstance(y, float):
            if struct.pack("<d", x) != struct.pack("<d", y) and not (math.isnan(x) and math.isnan(y)):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def test_write_csv_is_pandas_to_csv(tmp_path: Path) -> None:
    """Random columns of every type a results table may hold: the bytes pandas' to_csv wrote."""
    import numpy as np
    import pandas as pd

    from hpcsched.results import write_csv

    rnd = random.Random(14)
    pools: list[Callable[[], Any]] = [
        lambda: rnd.choice([rnd.uniform(-1e9, 1e9), 0.0, -0.0, 1e-7, 123456789.123456789, 5.0, 1e20, 2.5e-7]),
        lambda: rnd.choice([math.inf, -math.inf]), lambda: rnd.choice([None, math.nan]),
        lambda: rnd.randint(-10**6, 10**6), lambda: np.int64(rnd.randint(-100, 100)),
        lambda: np.float64(rnd.uniform(-1e3, 1e3)), lambda: np.float32(rnd.uniform(-10, 10)),
        lambda: rnd.choice(["a", "x,y", 'q"uote', "line\nbreak", "", " sp", "1.5", "é"]),
        lambda: rnd.choice([True, False]), lambda: rnd.choice([2**63 - 1, -(2**63)]),
    ]
    path = tmp_path / "t.csv"
    for _ in range(1500):
        cols = [f"c{i}" for i in range(rnd.randint(1, 4))]
        kinds = [rnd.sample(pools, rnd.randint(1, 3)) for _ in cols]
        rows = [tuple(rnd.choice(k)() for k in kinds) for _ in range(rnd.choice([0, 1, 2, 5, 30]))]
        write_csv(path, cols, rows)
        want = pd.DataFrame([dict(zip(cols, r, strict=True)) for r in rows], columns=cols).to_csv(
            index=False, float_format="%.6f")
        assert path.read_bytes() == want.encode(), rows
    for _ in range(300):  # the timeline: a frame built from a float array
        flat = [rnd.choice([rnd.uniform(0, 1e9), rnd.randint(0, 100), 0, math.nan, math.inf])
                for _ in range(4 * rnd.choice([0, 1, 3, 50]))]
        cols = ["time", "busy_gpus", "running_jobs", "queued_jobs"]
        it = iter(flat)
        write_csv(path, cols, list(zip(it, it, it, it, strict=True)), all_float=True)
        want = pd.DataFrame(np.array(flat, dtype=float).reshape(-1, 4), columns=cols).to_csv(
            index=False, float_format="%.6f")
        assert path.read_bytes() == want.encode(), flat


def test_summaries_are_pandas_and_numpy_to_the_bit(tmp_path: Path) -> None:
    """``summarize`` (a frame) and ``summarize_results`` (records) give numpy's sums, median and percentile."""
    import pandas as pd

    from hpcsched.metrics import summarize, summarize_results
    from hpcsched.results import JobResult, read_results, write_results

    rnd = random.Random(5)
    metas: list[dict[str, Any]] = [{}, {"capacity_gpus": 64}, {"capacity_nodes": 8}, {"capacity_node_seconds": 1.5e5},
                                   {"capacity_gpus": 64, "capacity_nodes": 8, "policy": "p", "tool": "t"}]
    for trial in range(120):
        n = rnd.choice([0, 1, 2, 7, 8, 9, 100, 129, 300, 1000, 2 * rnd.randint(0, 1500)] + [20000] * (trial == 0))
        ints = trial % 4 == 0  # integer times: int64 columns when read back
        rows = []
        for i in range(n):
            submit = rnd.randint(0, 10**6) if ints else rnd.choice([rnd.uniform(0, 1e7), 1.5e9 + rnd.uniform(0, 1e6)])
            start = None if rnd.random() < 0.1 else submit + (rnd.randint(0, 99) if ints else rnd.uniform(0, 1e5))
            end = None if start is None or rnd.random() < 0.1 else start + (rnd.randint(1, 10**6) if ints
                                                                            else rnd.uniform(0.1, 1e6))
            rows.append(JobResult(str(i), submit, start, end, rnd.choice([0, 1, 8]), rnd.choice([0, 3]),
                                  rnd.uniform(0, 1e7) if rnd.random() < 0.8 else 0.0, rnd.uniform(0, 1e5)))
        meta = rnd.choice(metas)
        frame = pd.DataFrame([{k: getattr(r, k) for k in JobResult.__slots__} for r in rows],
                             columns=list(JobResult.__slots__))
        want = _pandas_summary(frame, meta)
        assert _same_bits(summarize(frame, meta), want)
        assert _same_bits(summarize_results(rows, meta), want)
        write_results(tmp_path, rows, meta)
        df, read_meta = read_results(tmp_path)
        for table in (df, df.drop(columns=["gpu_seconds", "node_seconds"])):  # held time from sizes
            assert _same_bits(summarize(table, read_meta), _pandas_summary(table, read_meta))


def test_simulate_writes_what_pandas_wrote(tmp_path: Path, trace3: list, n8g8: Any) -> None:
    """A real run: jobs.csv and timeline.csv are pandas' to_csv of the frames, the summary pandas' summary."""
    from hpcsched.sim.engine import simulate
    from hpcsched.sim.runs import TIMELINE_FILE, write_run

    for compat in (None, "muri"):
        result = simulate(trace3, n8g8, "srsf", compat)
        out = write_run(tmp_path / str(compat), result)
        assert (out / "jobs.csv").read_bytes() == result.frame().to_csv(index=False, float_format="%.6f").encode()
        assert (out / TIMELINE_FILE).read_bytes() == result.timeline.to_csv(index=False, float_format="%.6f").encode()
        assert list(result.timeline.columns) == ["time", "busy_gpus", "running_jobs", "queued_jobs"]
        assert len(result.timeline) == result.events and str(result.timeline.dtypes.iloc[2]) == "float64"
        assert _same_bits(result.summary(), _pandas_summary(result.frame(), result.meta))


def test_plain_simulate_line_skips_building_typer_and_says_what_typer_says(tmp_path: Path) -> None:
    """``hpcsched simulate --trace T --cluster C --policy P --out D [--compat muri] [--json]`` runs the command
    function without building the Typer app (its pydantic adapters were a fifth of the start-up): same JSON,
    same files and the same errors and exit codes as through Typer; any other word goes to Typer."""
    import json
    import subprocess
    import sys

    from hpcsched.cli import _fast_simulate

    root = Path(__file__).resolve().parents[1]
    base = ["--trace", str(root / "trace-data/muri/trace3.csv"), "--cluster", str(root / "cluster_spec/n8g8.csv")]
    for extra in (["--help"], ["--restart-s", "0"], ["--as-controller"], ["--compat", "gavel"]):
        assert _fast_simulate([*base, "--policy", "fifo", "--out", str(tmp_path / "x"), *extra]) is None
    assert _fast_simulate([*base, "--policy", "fifo"]) is None  # no --out: Typer's message
    code = ("import sys; from hpcsched import cli; sys.argv = ['hpcsched'] + sys.argv[1:]; "
            "cli.main() if sys.argv[-1] != 'typer' else (sys.argv.pop(), cli.__getattr__('app')())")

    def run(policy: str, out: str, *more: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-X", "importtime", "-c", code, "simulate", *base, "--policy", policy,
                               "--out", str(tmp_path / out), "--compat", "muri", "--json", *more],
                              capture_output=True, text=True, timeout=120)

    fast, slow = run("srsf", "fast"), run("srsf", "slow", "typer")
    assert fast.returncode == slow.returncode == 0, fast.stderr[-500:] + slow.stderr[-500:]
    a, b = json.loads(fast.stdout), json.loads(slow.stdout)
    for d in (a, b):
        d.pop("wall_s"), d.pop("dir")
    assert a == b
    assert (tmp_path / "fast/jobs.csv").read_text() == (tmp_path / "slow/jobs.csv").read_text()
    assert "pydantic" not in fast.stderr and "pydantic" in slow.stderr  # importtime lists every module loaded
    bad_fast, bad_slow = run("nope", "b1"), run("nope", "b2", "typer")
    strip = lambda text: "\n".join(x for x in text.splitlines() if not x.startswith("import time:"))  # noqa: E731
    assert bad_fast.returncode == bad_slow.returncode == 2 and strip(bad_fast.stderr) == strip(bad_slow.stderr)
