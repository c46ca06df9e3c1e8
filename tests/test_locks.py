"""The lock files agree: what `make test` installs side by side (the main lock, then every extra's lock on
top) never asks for two versions of one package, and every pin carries a hash (pip's --require-hashes)."""

from __future__ import annotations

import re
from pathlib import Path

LOCKS = Path(__file__).resolve().parents[1] / "requirements"
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==(\S+)")


def _pins(lock: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    text = lock.read_text()
    for block in re.split(r"\n(?=\S)", text):
        m = PIN.match(block)
        if m:
            assert "--hash=sha256:" in block, f"{lock.name}: {m.group(1)} has no hash"
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def test_every_lock_agrees_with_every_other() -> None:
    locks = sorted(LOCKS.glob("*.lock"))
    assert {p.name for p in locks} >= {"main.lock", "all-extras.lock", "cbc.lock", "cvxpy.lock", "torch.lock"}
    seen: dict[str, tuple[str, str]] = {}
    for lock in locks:
        for name, version in _pins(lock).items():
            first = seen.setdefault(name, (version, lock.name))
            assert first[0] == version, f"{name}: {version} in {lock.name} but {first[0]} in {first[1]}"


def test_each_extra_lock_holds_the_whole_main_set() -> None:
    main = _pins(LOCKS / "main.lock")
    for lock in LOCKS.glob("*.lock"):
        if lock.name not in ("main.lock", "horovod.lock"):
            pins = _pins(lock)
            assert {k: pins.get(k) for k in main} == main, lock.name
