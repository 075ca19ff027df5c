"""``python -m rollgym``: the ``rollgym`` command, for an interpreter without its script."""

import os
import sys

# ``-m`` put the working directory first on sys.path, where the ``rollgym`` script puts its own
# folder: a file there named like a module the run imports (an ``impl:``'s, a verifier's
# dependency) would replace it in this process (the pre-flight, agents in process). Taken off
# before anything else is imported, as the server processes never have it (``python -P``).
if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from rollgym.cli.main import main

main()
