"""Spread calls over a server's replicas: least outstanding requests, sticky per rollout.

A multi-turn rollout keeps its session on one replica: the first call with a sticky key picks the
least-loaded replica and later calls with the same key go to the same one.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict

_STICKY_MAX = 65536  # sticky keys remembered; old rollouts fall out first


class Balancer:
    def __init__(self, urls: tuple[str, ...]) -> None:
        if not urls:
            raise ValueError("a target needs at least one URL")
        self.urls = urls
        self._outstanding = dict.fromkeys(urls, 0)
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._down: dict[str, float] = {}  # url -> when it may be tried again

    def pick(self, sticky: str | None = None, *, pin: bool = False) -> str:
        """A replica for the next call; ``pin`` returns the sticky key's replica even when it
        is down (the caller must not fail over: its state is there)."""
        if len(self.urls) == 1:
            return self.urls[0]
        if sticky is not None:
            url = self._sticky.get(sticky)
            if url is not None and (pin or not self.is_down(url)):
                self._sticky.move_to_end(sticky)
                return url
        live = [u for u in self.urls if not self.is_down(u)] or list(self.urls)
        url = min(live, key=self._outstanding.__getitem__)
        if sticky is not None:
            self._sticky[sticky] = url
            if len(self._sticky) > _STICKY_MAX:
                self._sticky.popitem(last=False)
        return url

    def begin(self, url: str) -> None:
        base = self._base(url)
        if base is not None:
            self._outstanding[base] += 1

    def end(self, url: str) -> None:
        base = self._base(url)
        if base is not None:
            self._outstanding[base] -= 1

    def mark_down(self, url: str, seconds: float | None = None) -> None:
        """Stop sending new requests to ``url`` (its process or node died); for ``seconds``
        only, if given, after which it is tried again (a restarted replica comes back)."""
        self._down[url] = math.inf if seconds is None else time.monotonic() + seconds

    def mark_up(self, url: str) -> None:
        self._down.pop(url, None)

    def is_down(self, url: str) -> bool:
        until = self._down.get(url)
        if until is None:
            return False
        if until <= time.monotonic():
            del self._down[url]
            return False
        return True

    def _base(self, url: str) -> str | None:
        if len(self.urls) == 1:
            return self.urls[0]
        # The longest base that ``url`` extends at a path boundary: a plain prefix test would
        # give http://h:80 the calls of http://h:8000.
        best: str | None = None
        for base in self.urls:
            if (url == base or url.startswith(base.rstrip("/") + "/")) and (
                best is None or len(base) > len(best)
            ):
                best = base
        return best
