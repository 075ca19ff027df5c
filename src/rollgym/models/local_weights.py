"""Reading a trainer's safetensors into the served model's parameters, checked first.

A push names a directory (what ``save_pretrained`` writes: ``model.safetensors`` or shards) or
one ``.safetensors`` file, under the server's weights root once links are resolved (its files
too). A path outside the root, a missing one and one without safetensors get one answer, word
for word: a caller must not learn from it what exists outside the root. Every tensor is checked against the served model before any is
copied: a name the model does not have, a shape that differs, or a parameter no file gives is
refused with a 4xx naming the tensor, and the served weights stay as they were. Floating-point
tensors of another dtype (a bf16 checkpoint for a float32 model) are cast; tied parameters
(``lm_head`` sharing the embedding) count as given when either name is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollgym.errors import InvalidRequest

if TYPE_CHECKING:
    import torch

MAX_NAMED = 5


def weight_files(path: str, root: Path) -> list[Path]:
    """The safetensors files of the checkpoint ``path`` under ``root`` (a resolved directory),
    each resolved; 400 if there are none, with the same message whatever the reason."""
    where = Path(os.path.realpath(path))
    files: list[Path] = []
    if where.is_relative_to(root):  # nothing outside the root is looked at further
        if where.is_dir():
            files = [Path(os.path.realpath(f)) for f in sorted(where.glob("*.safetensors"))]
        elif where.suffix == ".safetensors":
            files = [where]
    # A file linked out of the root is outside it too.
    if not files or not all(f.is_relative_to(root) and f.is_file() for f in files):
        raise InvalidRequest(
            f"not a checkpoint under the weights root {root}: a push names a directory "
            "holding .safetensors files, or one .safetensors file, under that root "
            "(serve-model's --weights-root, the option weights_root)",
            status=400,
        )
    return files


def read_weights(path: str, params: dict[str, torch.Tensor], root: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``path`` (under ``root``) checked against ``params`` (the model's state
    dict), ready to copy.

    Raises ``InvalidRequest`` (422) naming the first tensors that do not fit; 400 for a path
    that is not a checkpoint under ``root`` (``weight_files``).
    """
    import torch
    from safetensors import SafetensorError, safe_open

    aliases = _aliases(params)
    loaded: dict[str, torch.Tensor] = {}
    for file in weight_files(path, root):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
                    if name not in params:
                        raise _mismatch(f"tensor {name!r} in {file} is not a parameter of the "
                                        "served model (another architecture?)")  # fmt: skip
                    want = params[name]
                    shape = tuple(f.get_slice(name).get_shape())
                    if shape != tuple(want.shape):
                        raise _mismatch(
                            f"tensor {name!r} in {file} has shape {list(shape)}, the served "
                            f"model's has {list(want.shape)}"
                        )
                    tensor = f.get_tensor(name)
                    if tensor.dtype != want.dtype and not (
                        tensor.is_floating_point() and want.is_floating_point()
                    ):
                        raise _mismatch(
                            f"tensor {name!r} in {file} is {tensor.dtype}, the served model's "
                            f"is {want.dtype}"
                        )
                    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                        # NaN weights would make every later generation fail, not this push.
                        raise _mismatch(f"tensor {name!r} in {file} has NaN or infinite values")
                    loaded[name] = tensor.to(want.dtype)
        except SafetensorError as exc:
            raise InvalidRequest(
                f"{file}: not a readable safetensors file: {exc}", status=422
            ) from None
        except OSError as exc:
            raise InvalidRequest(f"{file}: cannot be read: {exc}", status=422) from None
    missing = sorted(
        name for name in params if name not in loaded and not (aliases[name] & loaded.keys())
    )
    if missing:
        shown = ", ".join(repr(n) for n in missing[:MAX_NAMED])
        more = f" and {len(missing) - MAX_NAMED} more" if len(missing) > MAX_NAMED else ""
        raise _mismatch(f"{path} lacks tensor {shown}{more} of the served model")
    return loaded


def copy_weights(params: dict[str, torch.Tensor], loaded: dict[str, torch.Tensor]) -> None:
    """Copy ``loaded`` (checked by ``read_weights``) into the model's tensors in place."""
    import torch

    with torch.no_grad():
        for name, tensor in loaded.items():
            params[name].copy_(tensor)


def _aliases(params: dict[str, Any]) -> dict[str, set[str]]:
    """For each name, the other names sharing its storage (tied weights)."""
    by_ptr: dict[int, set[str]] = {}
    for name, tensor in params.items():
        by_ptr.setdefault(tensor.data_ptr(), set()).add(name)
    return {name: by_ptr[t.data_ptr()] - {name} for name, t in params.items()}


def _mismatch(message: str) -> InvalidRequest:
    return InvalidRequest(message, status=422)
