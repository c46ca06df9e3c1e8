"""CLI start-up (issue 14): `hpcsched --help` and a command's import path stay free of heavy modules.

Nothing here is timed (timings belong to bench/bench_startup.py); the tests check which modules a path
imports, and that the lazily loaded CLI is the same CLI as one built by importing every area up front.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

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
