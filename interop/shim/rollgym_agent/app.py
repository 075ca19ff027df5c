"""rollgym's agent as a NeMo Gym agent server: ``gym env start`` runs this file like any
server's ``app.py`` (config in ``NEMO_GYM_CONFIG_DICT``, its own name in
``NEMO_GYM_CONFIG_PATH``). It translates its NeMo Gym entry into a rollgym config (the model
and resources servers given by URL, the agent on NeMo Gym's host and port) and becomes
``rollgym serve`` for it.

Entry fields: ``resources_server`` and ``model_server`` (NeMo Gym server refs), ``impl``
(``tool_agent`` or ``gymnasium_agent``), ``options`` (more agent options).
"""

import os
import sys
import tempfile
from pathlib import Path

import yaml


def inner(entry: dict) -> dict:
    return next(iter(next(iter(entry.values())).values()))


def main() -> None:
    config = yaml.safe_load(os.environ["NEMO_GYM_CONFIG_DICT"])
    me = inner(config[os.environ["NEMO_GYM_CONFIG_PATH"]])

    def url(server_ref: dict) -> str:
        target = inner(config[server_ref["name"]])
        return f"http://{target['host']}:{target['port']}"

    rollgym_config = {
        "servers": {
            "model": {"kind": "model", "url": url(me["model_server"])},
            "env": {"kind": "resources", "url": url(me["resources_server"])},
            "agent": {
                "kind": "agent",
                "impl": me.get("impl", "tool_agent"),
                "host": me["host"],
                "port": int(me["port"]),
                "options": {"model": "model", "resources": "env", **(me.get("options") or {})},
            },
        }
    }
    path = Path(tempfile.mkdtemp(prefix="rollgym-shim-")) / "config.yaml"
    path.write_text(yaml.safe_dump(rollgym_config))
    rollgym = str(Path(sys.executable).with_name("rollgym"))
    os.execv(rollgym, [rollgym, "serve", str(path)])


if __name__ == "__main__":
    main()
