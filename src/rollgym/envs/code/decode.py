"""The launcher's report read back: the probes' values as plain values of the server's own.

The line may be the program's forgery (``asserts.py`` says why that gains it nothing): the
reader never raises, and refuses what would make the server work for long (``codec.Decoder``).
"""

from __future__ import annotations

import json
from typing import Any

from rollgym.envs.code.codec import Decoder
from rollgym.envs.code.interpret import Failed


def read_report(data: bytes, probes: int) -> list[Any] | str:
    """The probes' values from the launcher's report line, or why it cannot be read. The
    line may be the program's forgery: whatever it holds, this returns, never raises."""
    lines = data.strip().split(b"\n")
    if not lines or not lines[-1]:
        return "the program ended before its tests were evaluated"
    try:
        report = json.loads(lines[-1])
        if not isinstance(report, list) or len(report) != probes:
            return "the report has the wrong shape"
        decoder = Decoder()  # one budget for the whole report
        out: list[Any] = []
        for entry in report:
            if entry[0] == "ok":
                out.append(decoder.decode(entry[1]))
            else:
                out.append(Failed(str(entry[1])[:300]))
        return out
    except Exception as exc:  # a forged or broken report: the program's doing
        return f"a value could not be read: {type(exc).__name__}: {str(exc)[:200]}"
