"""Progress bars are shown only to someone watching: not under --json or --quiet, not without a TTY."""

from __future__ import annotations

import io
import sys

import pytest

from hpcsched.progress import progress_bar, wanted


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_wanted_only_on_a_terminal_without_json_or_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not wanted()
    monkeypatch.setattr(sys, "stderr", _Tty())
    assert wanted()
    assert not wanted(as_json=True)
    assert not wanted(quiet=True)


def test_a_disabled_bar_yields_nothing_and_an_enabled_one_takes_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    with progress_bar("x", 10, False) as bar:
        assert bar is None
    monkeypatch.setattr(sys, "stderr", _Tty())
    with progress_bar("x", 10, True) as bar:
        assert bar is not None
        bar(3)
        bar(label="y")
        bar(10, 10)
