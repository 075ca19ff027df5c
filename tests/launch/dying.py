"""A server that starts fine and then dies, again after every restart: a crash loop."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from rollgym.envs.echo.server import EchoEnv


class DiesSoon(EchoEnv):
    async def startup(self) -> None:
        await super().startup()
        print("the many-worlds database is corrupt; exiting soon", file=sys.stderr, flush=True)
        asyncio.get_running_loop().call_later(0.3, os._exit, 3)

    async def verify(self, *args: Any, **kwargs: Any) -> Any:
        return await super().verify(*args, **kwargs)
