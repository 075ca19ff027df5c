"""Where rollgym's processes import code from: never the working directory.

A file in the directory a run starts from, named like a module the run imports (an ``impl:``'s,
a verifier's dependency such as ``math_verify``), would replace that module if the directory
were on the import path. It gets there three ways: ``python -m`` puts it first; an empty
``PYTHONPATH`` element (``PYTHONPATH=/x:``, what ``export PYTHONPATH=$PYTHONPATH:/x`` leaves
when it was unset) and a relative one (``.``, ``src``) are resolved against it, and ``python
-P`` drops only the first. So server processes start with ``-P`` and the absolute elements of
``PYTHONPATH`` only (``absolute_pythonpath``), and rollgym's own command takes the same entries
off its ``sys.path`` before it imports a run's code (``drop_working_directory``).
"""

from __future__ import annotations

import os
import sys


def relative_elements(pythonpath: str) -> list[str]:
    """The elements of ``pythonpath`` that name a place relative to the working directory
    (``""``, ``.``, ``src``): each is resolved against it."""
    return [part for part in pythonpath.split(os.pathsep) if not os.path.isabs(part)]


def absolute_pythonpath(pythonpath: str) -> str:
    """``pythonpath`` without its empty and relative elements."""
    return os.pathsep.join(part for part in pythonpath.split(os.pathsep) if os.path.isabs(part))


def drop_working_directory(*, module_run: bool = False) -> None:
    """Take off ``sys.path`` what names the working directory or a place under it only
    because a relative ``PYTHONPATH`` element put it there, and (``module_run``: in ``python
    -m rollgym``'s ``__main__``) the working directory ``-m`` put first. A directory that
    ``PYTHONPATH`` also names by an absolute path stays: someone asked for it."""
    if module_run and not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    pythonpath = os.environ.get("PYTHONPATH", "")
    relative = {os.path.abspath(part) for part in relative_elements(pythonpath)}
    if not relative:
        return
    # The interpreter resolved each element (site.py: absolute, duplicates removed).
    asked = {os.path.abspath(part) for part in absolute_pythonpath(pythonpath).split(os.pathsep)
             if part}  # fmt: skip
    unsafe = relative - asked
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry) not in unsafe]
