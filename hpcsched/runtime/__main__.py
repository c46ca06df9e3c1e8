"""``python -m hpcsched.runtime controller|worker|submit|jobs|cancel|workers|profile``."""

from hpcsched.runtime.cli import main

main()
