"""Start NeMo Gym 0.4.0's own ``example_single_tool_call`` resources server for the mixed run,
with NeMo Gym's own ``gym env start`` in the interop venv (``interop/setup.sh``), on
127.0.0.1:PORT (the ``url:`` of ``nemo_tool_call`` in config.yaml); Ctrl-C stops it.

    interop/setup.sh                                # once: .interop-venv with nemo-gym==0.4.0
    .venv/bin/python examples/mixed/nemo_gym.py --port 18765
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(
    0, str(ROOT)
)  # the interop package: NeMo Gym's launcher, as the interop suite runs it

from interop import nemo  # noqa: E402

SERVER = "example_single_tool_call"


@contextmanager
def nemo_gym_server(port: int, workspace: Path) -> Iterator[str]:
    """NeMo Gym's ``example_single_tool_call`` on 127.0.0.1:``port``; yields its URL once it
    answers ``/seed_session`` (a port taken by another process meanwhile fails here, clearly)."""
    config = nemo.server_entry(nemo.RESOURCES, SERVER, port, domain="agent")
    with nemo.gym_stack(nemo.Workspace(workspace), {SERVER: config}, relays=False):
        url = f"http://127.0.0.1:{port}"
        try:
            status, _ = nemo.http_json(url + "/seed_session", {}, timeout=30)
        except OSError as exc:
            status = exc
        if status != 200:
            raise RuntimeError(f"{url} is not NeMo Gym's {SERVER} (/seed_session: {status})")
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=18765)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with (
        tempfile.TemporaryDirectory(prefix="nemo-gym-") as tmp,
        nemo_gym_server(args.port, Path(tmp)) as url,
    ):
        print(f"NeMo Gym {SERVER} at {url} (Ctrl-C stops it)", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
