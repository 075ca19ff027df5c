"""Entry point of one server process: ``python -P -m rollgym.cli.worker --spec-fd N``, started
by the launcher (``rollgym.launch.process.WORKER``). It lists the dialects
(``rollgym.dialects``) and serves the server its spec names (``rollgym.launch.worker.main``)."""

from __future__ import annotations

import sys

from rollgym.dialects import SERVER_DIALECTS
from rollgym.errors import ConfigError
from rollgym.launch.worker import main

if __name__ == "__main__":
    try:
        main(SERVER_DIALECTS)
    except KeyboardInterrupt:
        sys.exit(0)
    except ConfigError as err:
        # A server that cannot start for a reason it can name (a missing extra, a bad option):
        # its log, which the launcher shows, says so in one line, not in a traceback.
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
