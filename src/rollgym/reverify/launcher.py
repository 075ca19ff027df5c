"""The launcher of a reverify run, ``ResourcesOnly``: the resources server and its peers,
nothing else. It lives with every other launcher in ``rollgym.collect.launchers``; re-exported
here for the imports of this older path."""

from rollgym.collect.launchers import ResourcesOnly

__all__ = ["ResourcesOnly"]
