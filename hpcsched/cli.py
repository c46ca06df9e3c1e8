"""``hpcsched`` command line. Each area registers its own sub-commands from its ``cli`` module.

Errors in the user's input print one line naming file and line and exit with code 2.
"""

from __future__ import annotations

import importlib
import sys

import typer

from hpcsched.errors import InputError

app = typer.Typer(
    name="hpcsched",
    help="Schedule deep-learning training on HPC clusters: simulate policies on real traces, "
    "harvest idle nodes, run the real runtime.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Modules that expose ``register(app)``; each area adds its line here.
COMMAND_MODULES = (
    "hpcsched.traces.cli",
    "hpcsched.calc_cli",
    "hpcsched.sweep.cli",
    "hpcsched.report.cli",
    "hpcsched.sim.cli",
    "hpcsched.sim.replay_cli",
    "hpcsched.runtime.cli",
    "hpcsched.slurm.cli",
    "hpcsched.testbed.cli",
)

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    try:
        app()
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
