"""Open a page in headless Chromium and report what happened, through the DevTools protocol
(a websocket: aiohttp speaks it, so no browser driver package is needed).

Chromium is the system's (``apt-get install -y chromium``); ``find_chromium`` is None without
it, and the browser tests skip saying so.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    given = os.environ.get("ROLLGYM_CHROMIUM")
    if given:
        return given
    return next((p for name in CANDIDATES if (p := shutil.which(name))), None)


@dataclass
class Rendered:
    errors: list[str] = field(default_factory=list)
    """Console errors and uncaught exceptions of the page."""
    requests: list[str] = field(default_factory=list)
    """Every URL the page asked for (the page itself included)."""
    value: Any = None
    """What ``probe`` evaluated to once it was truthy."""


class _Cdp:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = msg.json()
            if "id" in data and data["id"] in self.waiting:
                self.waiting.pop(data["id"]).set_result(data)
            elif "method" in data:
                self.events.append(data)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        i = next(self.ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[i] = fut
        await self.ws.send_json({"id": i, "method": method, "params": params})
        answer = await fut
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result


async def render(
    chromium: str, page: Path, probe: str, screenshot: Path | None, timeout: float = 30.0
) -> Rendered:
    """Open ``page`` (a file), wait until the JavaScript ``probe`` is truthy, take a full-page
    ``screenshot`` (PNG) and return the errors, the requests and the probe's value. ``page``
    must be an absolute path."""
    profile = tempfile.mkdtemp(prefix="rollgym-chromium-")
    proc = await asyncio.create_subprocess_exec(
        chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-extensions", "--remote-debugging-port=0", f"--user-data-dir={profile}",
        "--window-size=1400,900", "about:blank",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(timeout):
            return await _drive(proc, page, probe, screenshot)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


async def _drive(
    proc: asyncio.subprocess.Process, page: Path, probe: str, screenshot: Path | None
) -> Rendered:
    assert proc.stderr is not None
    while True:
        line = (await proc.stderr.readline()).decode()
        if not line:
            raise RuntimeError("chromium exited before it listened for DevTools")
        if "DevTools listening on " in line:
            browser_ws = line.split("DevTools listening on ", 1)[1].strip()
            break
    port = browser_ws.split("://", 1)[1].split("/", 1)[0]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{port}/json/list") as resp:
            targets = await resp.json()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        async with http.ws_connect(url, max_msg_size=0) as ws:
            cdp = _Cdp(ws)
            for domain in ("Runtime", "Log", "Network", "Page"):
                await cdp.send(f"{domain}.enable")
            await cdp.send("Page.navigate", url=page.as_uri())
            value: Any = None
            while not value:
                await asyncio.sleep(0.2)
                got = await cdp.send("Runtime.evaluate", expression=probe, returnByValue=True)
                value = got.get("result", {}).get("value")
            await asyncio.sleep(0.5)  # let the last plots paint before the screenshot
            if screenshot is not None:
                shot = await cdp.send(
                    "Page.captureScreenshot", format="png", captureBeyondViewport=True
                )
                await asyncio.to_thread(screenshot.write_bytes, base64.b64decode(shot["data"]))
            cdp.reader.cancel()
            return _collect(cdp.events, value)


def _collect(events: list[dict[str, Any]], value: Any) -> Rendered:
    out = Rendered(value=value)
    for event in events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            out.errors.append(
                " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
            )
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            out.errors.append(str(details.get("exception", {}).get("description") or details))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            out.errors.append(str(params["entry"].get("text")))
        elif method == "Network.requestWillBeSent":
            out.requests.append(str(params.get("request", {}).get("url")))
    return out
