"""Reference-compat accounting: how a peer's simulator ran each policy, kept out of the core contract.

A compat mode is a name (``--compat muri``); a policy declares, in its ``PolicyHints.compat``, the loop rules
that mode's reference used for it; the simulator's engine reads them only when that mode is on.
``--compat gavel`` is its own loop (``hpcsched.hetero.rounds``): Gavel's policies and round mechanism.
``--compat sia`` is its own loop (``hpcsched.sia``): the Sia artifact's rounds, restarts, Sia and its Gavel.
``--compat blox`` is its own loop too (``hpcsched.compat.blox``): Blox's rounds, sort, placement walk and metrics.

``--compat pollux`` likewise (``hpcsched.compat.pollux``): the Pollux OSDI'21 artifact's rounds and progress model.
"""

MODES = ("muri", "gavel", "blox", "pollux", "sia")
"""The compat modes the simulator knows."""
