"""``python -m rollgym``: the ``rollgym`` command, for an interpreter without its script."""

from rollgym.cli.main import main

main()
