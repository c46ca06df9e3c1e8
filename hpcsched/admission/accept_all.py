"""Accept-all: every job enters the queue as it arrives (Blox's default, and the behaviour without a step)."""

from __future__ import annotations

from hpcsched.admission import AdmissionView, register


@register("accept-all")
def accept_all(view: AdmissionView) -> dict[str, str]:
    return {}
