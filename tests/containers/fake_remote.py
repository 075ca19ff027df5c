"""A fake remote provider: the JSON shape of ``rollgym.containers.remote`` served on
127.0.0.1 (port 0) by a starlette app whose containers are this machine's podman ones. It stands
in for E2B, Modal or Daytona, which cannot run here; the contract tests drive ``RemoteRuntime``
through real HTTP against it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import tarfile
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollgym.containers.podman import PodmanContainer, PodmanRuntime, run
from rollgym.containers.runtime import Lease, Limits, Spec
from rollgym.errors import ContainerError


def make_app(podman: PodmanRuntime) -> Starlette:
    boxes: dict[str, PodmanContainer] = {}

    def box(body: dict[str, Any]) -> PodmanContainer:
        found = boxes.get(str(body.get("id")))
        if found is None:
            raise ContainerError("no such sandbox", status=404)
        return found

    async def create(body: dict[str, Any]) -> dict[str, Any]:
        wire = body["spec"]
        spec = Spec(
            image=wire["image"],
            limits=Limits(**wire["limits"]),
            lease=Lease(**wire["lease"]),
            workdir=wire.get("workdir"),
            env=wire.get("env") or {},
            labels=wire.get("labels") or {},
        )
        made = await podman.create(spec, timeout=60)
        boxes[made.id] = made
        return {"id": made.id}

    async def exec_(body: dict[str, Any]) -> dict[str, Any]:
        stdin = body.get("stdin")
        done = await box(body).exec(
            body["command"],
            timeout=float(body["timeout"]),
            max_output=int(body["max_output"]),
            stdin=None if stdin is None else base64.b64decode(stdin),
            workdir=body.get("workdir"),
            env=body.get("env") or None,
        )
        return {
            "exit_code": done.exit_code, "stdout": done.stdout, "stderr": done.stderr,
            "seconds": done.seconds, "timed_out": done.timed_out, "truncated": done.truncated,
            "disk_exceeded": done.disk_exceeded,
        }  # fmt: skip

    async def put(body: dict[str, Any]) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            raw = base64.b64decode(body["tar"])
            with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
                tar.extractall(tmp, filter="data")
                top = tar.getnames()[0].split("/", 1)[0]
            await box(body).put(Path(tmp) / top, body["dest"], timeout=60)
        return {}

    async def get(body: dict[str, Any]) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out"
            await box(body).get(body["source"], out, timeout=60)
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                tar.add(out, arcname="out")
        return {"tar": base64.b64encode(buffer.getvalue()).decode()}

    async def snapshot(body: dict[str, Any]) -> dict[str, Any]:
        return {"image": await box(body).snapshot(timeout=60)}

    async def stop(body: dict[str, Any]) -> dict[str, Any]:
        await box(body).stop_processes(timeout=60)
        return {}

    async def changes(body: dict[str, Any]) -> dict[str, Any]:
        found = await box(body).changes(
            timeout=60, drop=tuple(body.get("drop") or ()), max_bytes=int(body["max_bytes"]),
            max_entries=int(body["max_entries"]),
        )  # fmt: skip
        try:
            tar = base64.b64encode(found.archive.read_bytes()).decode()
        finally:
            found.discard()
        return {
            "tar": tar, "changed": list(found.changed), "deleted": list(found.deleted),
            "opaque": list(found.opaque), "dropped": list(found.dropped), "size": found.size,
        }  # fmt: skip

    async def cpu(body: dict[str, Any]) -> dict[str, Any]:
        return {"cpu_seconds": await box(body).cpu_seconds()}

    async def destroy(body: dict[str, Any]) -> dict[str, Any]:
        found = boxes.pop(str(body.get("id")), None)
        if found is not None:
            await found.destroy()
        return {}

    async def list_(body: dict[str, Any]) -> dict[str, Any]:
        items = [
            {"id": ident, "kind": kind.rstrip("s"), "labels": labels}
            for kind in ("containers", "images")
            for ident, labels in await podman.list_leased(kind)
        ]
        return {"items": items}

    async def remove(body: dict[str, Any]) -> dict[str, Any]:
        for ident in body["ids"]:
            boxes.pop(ident, None)
            gone = await run(podman.argv("rm", "-f", "-t", "0", ident), timeout=60)
            if gone.code != 0:  # not a container: an image
                await run(podman.argv("rmi", "-f", ident), timeout=60)
        return {}

    async def rmi(body: dict[str, Any]) -> dict[str, Any]:
        await podman.remove_image(str(body["image"]), timeout=60)
        return {}

    handlers = {
        "create": create, "exec": exec_, "put": put, "get": get, "snapshot": snapshot,
        "stop": stop, "changes": changes, "cpu": cpu, "destroy": destroy, "list": list_, "remove": remove, "rmi": rmi,
    }  # fmt: skip

    async def endpoint(request: Request) -> JSONResponse:
        handler = handlers.get(request.path_params["verb"])
        if handler is None:
            return JSONResponse({"error": "no such verb"}, status_code=404)
        try:
            return JSONResponse(await handler(await request.json()))
        except ContainerError as exc:
            status = exc.status if exc.status in (404, 409, 413) else 500
            return JSONResponse({"error": exc.to_dict()}, status_code=status)

    return Starlette(routes=[Route("/sandboxes/{verb}", endpoint, methods=["POST"])])


@contextlib.asynccontextmanager
async def serve_fake(podman: PodmanRuntime) -> AsyncIterator[str]:
    """Serve the fake provider on 127.0.0.1, an OS-chosen port; yield its URL."""
    config = uvicorn.Config(make_app(podman), host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(200):  # bounded: 10 s
        if server.started:
            break
        await asyncio.sleep(0.05)
    assert server.started, "the fake provider did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
