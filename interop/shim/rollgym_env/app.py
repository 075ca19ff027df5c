"""A rollgym environment as a NeMo Gym resources server: ``gym env start`` runs this file like
any server's ``app.py``, and it becomes ``rollgym serve`` for one rollgym resources server
(entry field ``impl``, e.g. ``lookup``, and ``options``) on NeMo Gym's host and port. NeMo Gym's
own agents then reach it through their config, as they reach any of NeMo Gym's servers.
"""

import os
import sys
import tempfile
from pathlib import Path

import yaml


def main() -> None:
    config = yaml.safe_load(os.environ["NEMO_GYM_CONFIG_DICT"])
    entry = config[os.environ["NEMO_GYM_CONFIG_PATH"]]
    me = next(iter(next(iter(entry.values())).values()))
    rollgym_config = {
        "servers": {
            "env": {
                "kind": "resources",
                "impl": me["impl"],
                "host": me["host"],
                "port": int(me["port"]),
                "options": me.get("options") or {},
            }
        }
    }
    path = Path(tempfile.mkdtemp(prefix="rollgym-shim-")) / "config.yaml"
    path.write_text(yaml.safe_dump(rollgym_config))
    rollgym = str(Path(sys.executable).with_name("rollgym"))
    os.execv(rollgym, [rollgym, "serve", str(path)])


if __name__ == "__main__":
    main()
