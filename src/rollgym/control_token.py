"""The control token: the credential a caller needs to change what a model server serves.

Model servers listen on TCP, where any local user can connect. The calls that change the served
policy (``POST /rollgym/weights``, ``/rollgym/pause``, ``/rollgym/resume``) therefore need
``Authorization: Bearer <token>``; reads (``GET /rollgym/weights``, ``/rollgym/policy``,
``/health``) and model calls do not. The token is per user, not per server: the threat is
another user of the machine (the owner's own processes can read each other's memory anyway),
and one token lets every rollgym client of the user (``PolicyControl``,
``LocalModelWeights``, the trainer API) reach every model server of the user with no
configuration. Where it comes from, first match wins:

1. ``ROLLGYM_CONTROL_TOKEN``: the token itself (set it on every machine of a cluster whose
   home directories differ);
2. the file ``ROLLGYM_CONTROL_TOKEN_FILE`` names, by default
   ``$XDG_STATE_HOME/rollgym/control-token`` (``~/.local/state/rollgym/control-token``),
   created with a random token on first use, mode 0600 in a 0700 directory. A file that is a
   link, not the user's own, or readable by others is refused: it would not be a secret; so is
   a directory that is a link, not the user's own, or open to others (0700 or less), where
   another user could put a file of their choosing in the token's place. The directory is
   checked, never changed (``ROLLGYM_CONTROL_TOKEN_FILE`` may name a folder kept open on
   purpose): the error says the command that fixes it.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import re
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from rollgym import credentials
from rollgym.errors import ConfigError, InvalidRequest

__all__ = [
    "ENV_TOKEN",
    "ENV_TOKEN_FILE",
    "authorization",
    "control_token",
    "require",
    "token_file",
]

ENV_TOKEN = "ROLLGYM_CONTROL_TOKEN"
ENV_TOKEN_FILE = "ROLLGYM_CONTROL_TOKEN_FILE"
HEADER = "authorization"
MAX_TOKEN_CHARS = 512
_TOKEN = re.compile(rf"[A-Za-z0-9._~+/=-]{{16,{MAX_TOKEN_CHARS}}}")
"""What a token may be: header-safe characters, long enough to be a secret."""

HOW = (
    f"send 'Authorization: Bearer <token>' with the token of the user the server runs as "
    f"(its {ENV_TOKEN}, else the file {ENV_TOKEN_FILE} names, by default "
    "~/.local/state/rollgym/control-token, readable only by that user); rollgym's clients "
    "(PolicyControl, LocalModelWeights) send it themselves"
)


def token_file() -> Path:
    """Where the token is kept: ``ROLLGYM_CONTROL_TOKEN_FILE``, else the user's state dir."""
    named = os.environ.get(ENV_TOKEN_FILE)
    if named:
        return Path(named).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "rollgym" / "control-token"


def control_token() -> str:
    """This user's control token (see the module docstring); created if there is none yet.

    Raises ``ConfigError`` for a token that is malformed or a file that is not a secret.
    """
    given = os.environ.get(ENV_TOKEN)
    if given is not None:
        token = _checked(given.strip(), ENV_TOKEN)
    else:
        path = token_file()
        folder = _open_folder(path.parent)
        try:
            try:
                token = _read(path, folder)
            except FileNotFoundError:
                token = _create(path, folder)
        finally:
            os.close(folder)
    credentials.remember(token, None)  # masked in every error and log from now on
    return token


def authorization(token: str) -> dict[str, str]:
    """The header that carries ``token``."""
    return {HEADER: f"Bearer {token}"}


def require(headers: Mapping[str, str], token: str, endpoint: str) -> None:
    """Raise ``InvalidRequest`` (401 without a bearer token, 403 with another one) unless
    ``headers`` carry ``token``."""
    scheme, _, sent = (headers.get(HEADER) or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not sent.strip():
        raise InvalidRequest(f"{endpoint} needs the control token: {HOW}", status=401)
    # Constant time: the answer's timing must not tell how much of a guess was right.
    if not hmac.compare_digest(sent.strip().encode(), token.encode()):
        raise InvalidRequest(f"{endpoint}: wrong control token: {HOW}", status=403)


def _checked(token: str, where: str) -> str:
    if not _TOKEN.fullmatch(token):
        raise ConfigError(
            f"{where}: not a control token (16 to {MAX_TOKEN_CHARS} characters of "
            "A-Z a-z 0-9 . _ ~ + / = -)"
        )
    return token


def _open_folder(folder: Path) -> int:
    """A descriptor of the token file's directory (made, mode 0700, if missing), checked to be
    no link, this user's own and closed to others. The file is then opened relative to it
    (``dir_fd``), so the directory checked is the one used, whatever is renamed meanwhile."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(folder, flags)
        except FileNotFoundError:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(folder, flags)
    except OSError as exc:
        if folder.is_symlink():  # ELOOP from O_NOFOLLOW
            raise ConfigError(_unsafe_folder(folder, "is a symbolic link")) from None
        raise ConfigError(
            f"{folder}: cannot open the control token's directory: {exc.strerror or exc}"
        ) from None
    info = os.fstat(fd)
    own = info.st_uid == os.geteuid()
    if not own or info.st_mode & 0o077:
        os.close(fd)
        mode = f"is open to others (mode {stat.S_IMODE(info.st_mode):04o})"
        raise ConfigError(_unsafe_folder(folder, mode if own else "is another user's", own))
    return fd


def _unsafe_folder(folder: Path, why: str, own: bool = False) -> str:
    fix = (
        f"chmod 700 {folder}" if own
        else f"set {ENV_TOKEN_FILE} to a file in a directory of your own, mode 0700"
    )  # fmt: skip
    return (
        f"{folder}: the control token's directory {why}; it must be this user's own, mode "
        f"0700, and no link, or another user could put their file in the token's place: {fix}"
    )


def _read(path: Path, folder: int) -> str:
    # O_NOFOLLOW: a link planted where the token goes must not make another file the secret.
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except FileNotFoundError:
        raise
    except OSError as exc:  # a link (ELOOP), a directory, no permission
        raise ConfigError(f"{path}: cannot read the control token file: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path}: the control token file must be a regular file")
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise ConfigError(
                f"{path}: the control token file must be this user's own and readable by "
                f"nobody else (chmod 600 {path})"
            )
        data = os.read(fd, MAX_TOKEN_CHARS + 2)
    finally:
        os.close(fd)
    return _checked(data.decode("ascii", "replace").strip(), str(path))


def _create(path: Path, folder: int) -> str:
    token = secrets.token_urlsafe(32)
    # Written whole under another name, then linked into place: a reader never sees a half
    # file, and of two processes creating it at once one wins and both use its token.
    temp = f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600, dir_fd=folder)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
        try:
            os.link(temp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except FileExistsError:
            return _read(path, folder)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=folder)
    return token
