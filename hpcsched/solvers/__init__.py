"""Mathematical-programming solvers shared by the whole package (``highs``: the one HiGHS wrapper)."""
