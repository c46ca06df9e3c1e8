"""Imports the generated gRPC stubs, generating them first when a checkout has none.

The stubs are build output (``make rpc``) and are not committed. An editable install or a fresh clone
that skipped ``make rpc`` would otherwise fail with an obscure ImportError deep in the controller.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from types import ModuleType

_PROTO_DIR = Path(__file__).parent / "proto"
_NAME = "hpcsched_runtime"


def _generate() -> None:
    """Run grpc_tools.protoc the way ``make rpc`` does (repository root as include path)."""
    root = _PROTO_DIR.parents[2]
    proto = _PROTO_DIR.relative_to(root) / f"{_NAME}.proto"
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        raise ImportError(
            "hpcsched runtime: gRPC stubs are missing and grpcio-tools is not installed; "
            "run `make rpc` (or `pip install grpcio-tools` and retry)"
        ) from None
    # Generate aside, then rename: a concurrent importer never reads half a file.
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={tmp}", f"--grpc_python_out={tmp}",
               f"--pyi_out={tmp}", str(proto)]
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        if done.returncode != 0:
            raise ImportError(f"hpcsched runtime: generating gRPC stubs failed ({done.stderr.strip()}); run `make rpc`")
        for f in (Path(tmp) / proto.parent).iterdir():
            os.replace(f, _PROTO_DIR / f.name)


def _stale() -> bool:
    """Stubs older than the .proto (a pull that added a field) would import fine and fail later, far from here."""
    stub, proto = _PROTO_DIR / f"{_NAME}_pb2.py", _PROTO_DIR / f"{_NAME}.proto"
    return stub.exists() and stub.stat().st_mtime < proto.stat().st_mtime


def _load() -> tuple[ModuleType, ModuleType]:
    base = "hpcsched.runtime.proto"
    if _stale():
        try:
            _generate()
        except (ImportError, OSError) as e:  # no grpcio-tools, or a read-only install: use them, but say so
            warnings.warn(f"hpcsched runtime: gRPC stubs are older than {_NAME}.proto and could not be "
                          f"regenerated ({e}); run `make rpc`", stacklevel=2)
    try:
        return importlib.import_module(f"{base}.{_NAME}_pb2"), importlib.import_module(f"{base}.{_NAME}_pb2_grpc")
    except ImportError:
        _generate()
        importlib.invalidate_caches()
        return importlib.import_module(f"{base}.{_NAME}_pb2"), importlib.import_module(f"{base}.{_NAME}_pb2_grpc")


pb, pb_grpc = _load()
