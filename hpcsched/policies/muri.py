"""Muri's interleaving policies (Muri-S, Muri-L) and Muri-S+, registered from ``hpcsched.interleave``.

They group jobs whose stages complement each other onto the same GPUs (``hpcsched.interleave.policies``);
under ``--compat muri`` they ran in the reference's Muri loop (two passes, never-run jobs shown their
trace duration).
"""

from __future__ import annotations

from hpcsched.allocator import PolicyHints
from hpcsched.compat.muri import MURI_LOOP
from hpcsched.interleave.policies import muri_l, muri_s, muri_s_plus
from hpcsched.policies import register

muri_s_policy = register("muri-s", hints=PolicyHints(compat={"muri": MURI_LOOP}))(muri_s())
muri_l_policy = register("muri-l", hints=PolicyHints(compat={"muri": MURI_LOOP}))(muri_l())
muri_s_plus_policy = register("muri-s+")(muri_s_plus())  # not in the reference: its SRTF loop under compat
