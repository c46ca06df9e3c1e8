"""``hpcsched`` command line. Each area registers its own sub-commands from its ``cli`` module.

Start-up (a target: the command stays a small part of a run): the areas' ``cli`` modules are imported only when
their command runs. ``COMMANDS`` names, for each top-level command, the module whose ``register(app)`` defines
it and the first paragraph of its help, which is all ``hpcsched --help`` shows; so the listing imports none of
them, and ``hpcsched simulate ...`` imports the simulator's module alone instead of every area's (pandas,
matplotlib, gRPC, the MILP solvers...). ``tests/test_cli_startup.py`` holds the table to what the modules
register, so a new command or a reworded first paragraph fails there until its line here is updated.

Errors in the user's input print one line naming file and line and exit with code 2.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from hpcsched.errors import InputError

# Typer (and the pydantic it imports) is loaded when the app is first needed (``app``, ``main``), not by
# ``import hpcsched.cli``: ``main`` hands ``simulate --compat gavel`` straight to the hetero package, whose
# runs are short enough that those imports were a third of them. Everything else is unchanged.

# name -> (module exposing ``register(app)`` that defines it, the first paragraph of its help), in the order
# ``hpcsched --help`` lists them: Typer lists plain commands first, then groups (trace, slurm). Each area
# adds its lines here.
COMMANDS: dict[str, tuple[str, str]] = {
    "calc": ("hpcsched.calc_cli",
             "Report avg / p50 / p95 / p99 JCT, makespan, span, queueing delay and utilisation."),
    "sweep": ("hpcsched.sweep.cli",
              "Run every cell of a declarative grid (policies x traces x clusters x loads x seeds x compat, or\n"
              "replay parameters such as Tfwd and solver) and write one tidy table with a row per cell."),
    "report": ("hpcsched.report.cli",
               "Write a Markdown summary and PNG plots: JCT CDFs per trace, avg/p99 JCT and makespan bars\n"
               "normalised to a baseline policy (Muri's Figures 9-10 layout), utilisation over time, and\n"
               "harvested node-hours / utilisation vs Tfwd for replays. The numbers behind each plot are\n"
               "printed as tables too, and results.csv is copied beside them."),
    "simulate": ("hpcsched.sim.cli",
                 "Simulate one policy on a DL trace; write per-job results and the cluster timeline."),
    "compare": ("hpcsched.sim.cli",
                "Simulate several policies on one trace; print a comparison table and write a JCT CDF plot."),
    "replay": ("hpcsched.harvest.cli",
               "Replay idle nodes harvested by elastic jobs (BFTrainer), one allocator decision per pool change."),
    "controller": ("hpcsched.runtime.cli",
                   "Run the controller: scheduler, job API and state store. Stops on SIGINT/SIGTERM."),
    "worker": ("hpcsched.runtime.cli",
               "Run a worker daemon for this node: registers, heartbeats, launches and kills tasks."),
    "submit": ("hpcsched.runtime.cli",
               "Submit training jobs; relative paths in a command resolve from its job file's folder."),
    "jobs": ("hpcsched.runtime.cli", "List jobs: id, name, user, state, size, progress and age (-o wide: loss, "
             "checkpoint, workers, message...)."),
    "cancel": ("hpcsched.runtime.cli", "Cancel jobs: a running one checkpoints and stops."),
    "workers": ("hpcsched.runtime.cli", "List the workers the controller knows: state, slots in use, GPUs and their "
                "type, pilot, host."),
    "profile": ("hpcsched.runtime.cli", "Write measured stage times (Muri CSV) and scaling curves (BFTrainer JNPs + "
                "Jbnd CSV) for the simulator."),
    "testbed": ("hpcsched.testbed.cli",
                "Replay a trace through the real controller and workers; compare with the simulator."),
    "trace": ("hpcsched.traces.cli", "Look inside trace files."),
    "slurm": ("hpcsched.slurm.cli",
              "Harvest the nodes a live Slurm leaves idle (scripts/slurm_cluster.sh up for a test one)."),
}

# The modules, each once (the order they were registered in before commands were loaded lazily).
COMMAND_MODULES = tuple(dict.fromkeys(module for module, _ in COMMANDS.values()))


def _build() -> dict[str, Any]:
    """Typer's app and its lazy group, built once on first use (see the note on imports above)."""
    import typer
    from typer.core import TyperCommand, TyperGroup

    def load_commands(module: str) -> dict[str, Any]:
        """The click commands ``module.register`` defines, built as ``app`` would build them.

        A fresh Typer with the app's defaults receives the registration, so each command's options, help
        and rich settings are the ones it had when every module registered on ``app`` itself.
        """
        sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        importlib.import_module(module).register(sub)
        return dict(typer.main.get_group(sub).commands)


    class LazyGroup(TyperGroup):
        """The top-level group: lists ``COMMANDS`` from the table, imports a command's module when it runs.

        ``self.commands`` holds listing stubs (so Typer's "did you mean" still knows every name);
        ``get_command`` hands out the real command except while the group's own help is being formatted.
        """

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.commands = {name: TyperCommand(name, help=summary)
                             for name, (_, summary) in COMMANDS.items()}
            self._loaded: dict[str, Any] = {}
            self._listing = False

        def list_commands(self, ctx: Any) -> list[str]:
            return list(COMMANDS)

        def get_command(self, ctx: Any, cmd_name: str) -> Any:
            if cmd_name not in COMMANDS:
                return None
            if self._listing:
                return self.commands[cmd_name]
            if cmd_name not in self._loaded:
                module = COMMANDS[cmd_name][0]
                self._loaded.update(load_commands(module))
                if cmd_name not in self._loaded:
                    raise RuntimeError(f"{module}.register() defines no command {cmd_name!r} (hpcsched.cli.COMMANDS)")
            return self._loaded[cmd_name]

        def format_help(self, ctx: Any, formatter: Any) -> None:
            self._listing = True
            try:
                super().format_help(ctx, formatter)
            finally:
                self._listing = False


    app = typer.Typer(
        name="hpcsched",
        cls=LazyGroup,
        help="Schedule deep-learning training on HPC clusters: simulate policies on real traces, "
        "harvest idle nodes, run the real runtime.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )


    @app.callback()
    def _root() -> None:
        # Typer builds a group only for an app with a callback or commands; the commands come from LazyGroup.
        pass

    return {"app": app, "LazyGroup": LazyGroup, "load_commands": load_commands}


_BUILT: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """``app``, ``LazyGroup`` and ``load_commands``, built on first access (PEP 562)."""
    if name in ("app", "LazyGroup", "load_commands"):
        if not _BUILT:
            _BUILT.update(_build())
        return _BUILT[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _maybe_gavel(args: list[str]) -> bool:
    """A cheap look at a ``simulate`` line: could it be ``--compat gavel`` or a ``type=count`` cluster? Only
    then is the hetero package imported (every other simulate must not pay its import: start-up time)."""
    return any(a == "gavel" or a.endswith("=gavel") or ("=" in a and not a.startswith("-")) for a in args)


_FAST_SIMULATE = {"--trace": "trace", "--cluster": "cluster", "--policy": "policy", "--out": "out",
                  "--compat": "compat", "--window": "window"}


def _fast_simulate(args: list[str]) -> int | None:
    """``hpcsched simulate`` without building the Typer app, for the plain line the README and scripts use
    (``--trace``, ``--cluster``, ``--policy``, ``--out``, optional ``--compat muri|blox``, ``--window`` and
    ``--json``, each once,
    ``--opt value`` or ``--opt=value``); None for anything else, which Typer then parses with its own help and
    messages. Why: building the app loads Typer's pydantic adapters, about a fifth of the command's start-up
    (the target is 5x faster than the reference simulator's whole run). The command is the same function."""
    from hpcsched.argline import read_plain_line

    line = read_plain_line(args, _FAST_SIMULATE)
    if line is None:
        return None
    opts, as_json = line
    if not {"trace", "cluster", "policy", "out"} <= set(opts) or opts.get("compat", "muri") not in ("muri", "blox"):
        return None
    if opts.get("compat") == "blox":
        return _fast_blox(opts) if as_json else None
    import typer

    from hpcsched.sim.cli import simulate_cmd

    try:
        simulate_cmd(trace=Path(opts["trace"]), cluster=Path(opts["cluster"]), policy=opts["policy"],
                     out=Path(opts["out"]), as_json=as_json, compat=opts.get("compat"), restart_s=None,
                     as_controller=False, min_runtime_s=10.0, admission="accept-all", load_threshold=1.0,
                     placement="consolidated", solver="auto", slowdown_factor=None, window=opts.get("window"),
                     round_s=300.0, blox_optimus_load=None, profiles=None, seed=0, pollux_optimiser=None)
    except typer.BadParameter:  # raised before any work (a bad --window): Typer parses again and says it its way
        return None
    except typer.Exit as e:
        return e.exit_code
    return 0


def _fast_blox(opts: dict[str, str]) -> int | None:
    """``simulate --compat blox ... --json`` (the contract line other tools call) straight to Blox's loop: neither
    Typer nor the DL engine is imported (half this command's start-up; its run is a fraction of a second). None
    for what Typer should say in its own words (a bad --window, an unknown policy), which then parses again."""
    from hpcsched.compat.blox import POLICIES
    from hpcsched.window import parse_window

    try:
        window = parse_window(opts["window"]) if "window" in opts else None
    except ValueError:
        return None
    if opts["policy"] not in POLICIES:
        return None
    from hpcsched.sim.blox_run import run_blox_command

    try:
        run_blox_command(Path(opts["trace"]), Path(opts["cluster"]), opts["policy"], Path(opts["out"]), True, window,
                         300.0, None)
    except (ValueError, InputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def main() -> None:
    if sys.argv[1:2] == ["simulate"] and _maybe_gavel(sys.argv[2:]):
        from hpcsched.hetero.simulate import fast_main

        code = fast_main(sys.argv[2:])  # None: not a plain `simulate --compat gavel` line, Typer parses it
        if code is not None:
            sys.exit(code)
    try:
        if sys.argv[1:2] == ["simulate"]:
            code = _fast_simulate(sys.argv[2:])
            if code is not None:
                sys.exit(code)
        __getattr__("app")()
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
