"""Checking a checkpoint before an inference server is asked to load it.

A trainer's ``model.save_pretrained(path)`` writes a directory with ``config.json`` and one or
more ``*.safetensors`` files. Before a push, ``checkpoint_dir`` resolves the path to an
absolute one (vLLM reads a relative path as a Hugging Face repo id) and checks that it is such
a directory; ``check_matches`` compares its tensors with the served checkpoint's: the same
parameter names, shapes and dtypes, or ``BadCheckpoint`` naming the first differences. vLLM
0.32 loads a mismatched checkpoint into a broken engine (its next request kills the server) or,
for a merged projection, silently into the wrong rows; nothing is sent when they differ.

Only the safetensors headers are read (an 8-byte little-endian length, then that many bytes of
JSON: ``{"name": {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}``), so a check
costs a few kilobytes of reading whatever the model's size, and needs no torch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import orjson

from rollgym.errors import BadCheckpoint

__all__ = ["TensorSpec", "check_matches", "checkpoint_dir", "differences", "tensor_specs"]

HEADER_LIMIT = 100 * 1024 * 1024
"""The largest safetensors header read (the format's own limit): a longer one is no header."""
SHOWN = 5
"""Differences named in a ``BadCheckpoint`` message (the count says how many there are)."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    dtype: str
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


def checkpoint_dir(path: str | Path) -> Path:
    """``path`` made absolute, if it is a checkpoint directory (``config.json`` and at least
    one ``*.safetensors``); else ``BadCheckpoint`` saying what is wrong."""
    resolved = Path(path).expanduser().resolve()
    if not resolved.exists():
        raise BadCheckpoint(f"no checkpoint at {resolved} (from {str(path)!r}): nothing there")
    if not resolved.is_dir():
        raise BadCheckpoint(
            f"{resolved} is a file: a checkpoint is the directory save_pretrained() wrote"
        )
    missing = [] if (resolved / "config.json").is_file() else ["config.json"]
    if not any(resolved.glob("*.safetensors")):
        missing.append("*.safetensors (save with safe_serialization, the default)")
    if missing:
        raise BadCheckpoint(f"{resolved} is not a checkpoint directory: no {', '.join(missing)}")
    return resolved


def tensor_specs(directory: Path) -> dict[str, TensorSpec]:
    """Every tensor of the checkpoint in ``directory`` (all its ``*.safetensors`` shards), read
    from the files' headers only."""
    specs: dict[str, TensorSpec] = {}
    for file in sorted(directory.glob("*.safetensors")):
        for name, entry in _header(file).items():
            if name == "__metadata__":
                continue
            if not isinstance(entry, dict) or not isinstance(entry.get("shape"), list):
                raise BadCheckpoint(f"{file}: tensor {name!r} has no shape in its header")
            specs[name] = TensorSpec(str(entry.get("dtype")), tuple(entry["shape"]))
    return specs


def _header(file: Path) -> dict[str, object]:
    try:
        with file.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise BadCheckpoint(f"{file} is not a safetensors file (shorter than 8 bytes)")
            (size,) = struct.unpack("<Q", head)
            if size > HEADER_LIMIT:
                raise BadCheckpoint(f"{file} is not a safetensors file (a {size}-byte header)")
            raw = f.read(size)
    except OSError as exc:
        raise BadCheckpoint(f"{file}: cannot read it: {exc}") from None
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError:
        header = None
    if not isinstance(header, dict):
        raise BadCheckpoint(f"{file} is not a safetensors file (its header is not JSON)")
    return header


def differences(
    new: dict[str, TensorSpec], served: dict[str, TensorSpec], *, dtypes: bool = True
) -> list[str]:
    """What differs between two checkpoints' tensors, one line each, sorted by name."""
    out = []
    for name in sorted(new.keys() | served.keys()):
        a, b = new.get(name), served.get(name)
        if a is None:
            out.append(f"tensor {name!r} is missing (served: {b})")
        elif b is None:
            out.append(f"tensor {name!r} is not in the served model ({a})")
        elif a.shape != b.shape or (dtypes and a.dtype != b.dtype):
            out.append(f"tensor {name!r} is {a}, the served one {b}")
    return out


def check_matches(new: Path, served: Path, *, dtypes: bool = True) -> None:
    """``BadCheckpoint`` unless the checkpoints in ``new`` and ``served`` hold the same
    tensor names and shapes (and dtypes, with ``dtypes``)."""
    found = differences(tensor_specs(new), tensor_specs(served), dtypes=dtypes)
    if found:
        shown = "; ".join(found[:SHOWN])
        more = f" (and {len(found) - SHOWN} more)" if len(found) > SHOWN else ""
        raise BadCheckpoint(
            f"{new} does not match the served model ({served}): {len(found)} tensors differ: "
            f"{shown}{more}"
        )
