"""Where a device pool is written down on this machine: its pool file and its token file.

A pool (``python -m pwkernel.pool start --name NAME``, docs/pool.md) lives in the pool
directory, ``$PWKERNEL_POOL_DIR`` or else ``~/.pwkernel/pools`` (made owner-only):

- ``<dir>/<NAME>.json``: the pool's record, keys ``name``, ``address`` (host:port of the Ray
  cluster's GCS), ``token_path``, ``islands`` (devices per island), ``platform``, ``lease``,
  ``started_cluster`` (whether the pool started that cluster), ``session_dir``, ``temp_dir``,
  ``pids`` (the Ray processes the pool started) and ``started`` (a Unix time);
- ``<dir>/<NAME>.token``: Ray's authentication token for the pool's cluster, created with
  mode 0600 before anything is written into it.

A controller attaching to the pool on this machine reads the token's path from here
(``cluster.connect(address, pool=NAME)``), so nobody copies a token by hand.

>>> load("class") is None or load("class")["name"] == "class"            # doctest: +SKIP
True
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

from ...runtime.errors import DeviceSetupError

ENV = "PWKERNEL_POOL_DIR"
KEYS = ("name", "address", "token_path", "islands", "platform", "lease", "started_cluster",
        "session_dir", "temp_dir", "pids", "started")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class PoolNameError(DeviceSetupError):
    """A pool name that cannot name files and a Ray namespace."""


def check_name(name: str) -> str:
    """``name`` if it can name a pool: 1 to 64 letters, digits, ``-``, ``_`` or ``.``,
    starting with a letter or digit (it names files and a Ray namespace)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise PoolNameError(
            f"pool name {name!r} is not 1 to 64 letters, digits, '-', '_' or '.' starting "
            "with a letter or digit; e.g. 'class' (--name class, pool='class')")
    return name


def pool_dir() -> Path:
    """The pool directory (not created here)."""
    chosen = os.environ.get(ENV, "").strip()
    return Path(chosen).expanduser() if chosen else Path.home() / ".pwkernel" / "pools"


def file_path(name: str) -> Path:
    """The pool file of pool ``name``."""
    return pool_dir() / f"{check_name(name)}.json"


def token_path(name: str) -> Path:
    """The token file of pool ``name`` (it may not exist)."""
    return pool_dir() / f"{check_name(name)}.token"


def load(name: str) -> dict[str, Any] | None:
    """Pool ``name``'s record, or None when no pool of that name is written down here."""
    path = file_path(name)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise DeviceSetupError(
            f"the pool file {path} is not JSON ({e}); stop the pool with `python -m "
            f"pwkernel.pool stop --name {name}`, or delete the file if no pool runs.") from None
    if not isinstance(record, dict) or record.get("name") != name:
        raise DeviceSetupError(f"the pool file {path} does not describe pool {name!r}; "
                               "delete it if no pool of that name runs.")
    return record


def records() -> list[dict[str, Any]]:
    """The records of every pool written down here, by name (unreadable files left out)."""
    found = []
    for path in sorted(pool_dir().glob("*.json")):
        try:
            record = load(path.stem)
        except DeviceSetupError:  # (not a pool's name, or not a pool's file)
            continue
        if record is not None:
            found.append(record)
    return found


def _private_dir() -> Path:
    folder = pool_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file that only its owner can read (mode 0600 from the
    start: the file never exists with wider permissions, whatever the umask)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def save(record: dict[str, Any]) -> Path:
    """Write a pool's record (replacing the old one at once: readers never see half)."""
    missing = [k for k in KEYS if k not in record]
    if missing:
        raise ValueError(f"a pool record needs the keys {list(KEYS)}; missing {missing}")
    path = file_path(record["name"])
    _private_dir()
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    _write_private(tmp, json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def new_token(name: str) -> Path:
    """A fresh random token (256 bits, as Ray makes them) in pool ``name``'s token file,
    replacing an old one; returns the file's path."""
    return write_token(name, secrets.token_hex(32))


def write_token(name: str, token: str) -> Path:
    """``token`` in pool ``name``'s token file (mode 0600), replacing an old one."""
    path = token_path(name)
    _private_dir()
    path.unlink(missing_ok=True)
    _write_private(path, token.strip())
    return path


def start_holder(name: str) -> str | None:
    """The pid of the ``start`` of pool ``name`` running now (it holds the lock
    ``<dir>/.<NAME>.starting``, docs/pool.md), else None: until it returns, the pool's file
    may be missing or name a cluster whose islands are not up yet."""
    path = pool_dir() / f".{check_name(name)}.starting"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None  # no start runs (the file goes when a start ends)
    try:
        try:  # shared, at once: fails only while a start holds it
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 32).decode(errors="replace").strip() or "?"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def being_started(name: str, holder: str) -> str:
    """What to say to whoever asks for pool ``name`` while process ``holder`` starts it."""
    return (f"pool {name!r} is being started right now (pid {holder}); its islands are not "
            f"up yet. Ask again once `python -m pwkernel.pool start --name {name}` has "
            "printed how to attach.")


def remove(name: str) -> None:
    """Forget pool ``name``: its pool file and token file go."""
    file_path(name).unlink(missing_ok=True)
    token_path(name).unlink(missing_ok=True)


def not_answering(pool: str, address: str, unreachable: str) -> str:
    """Why a pool does not answer at ``address``, and what to do: a pool this machine has
    written down was stopped or died (``stop`` cleans up, then ``start``); one it has not
    runs elsewhere, or was never started."""
    said = f"pool {pool!r} does not answer at {address} ({unreachable})"
    try:
        here = load(pool) is not None
    except DeviceSetupError:  # (a file that cannot be read: written down all the same)
        here = True
    if here:
        return (f"{said}: it is not running (it was stopped, its head died, or the machine "
                f"restarted). Start it again: python -m pwkernel.pool stop --name {pool} "
                f"(it cleans up what is left), then python -m pwkernel.pool start --name "
                f"{pool} --islands ...; or check the address.")
    return (f"{said}, and no pool of that name was started on this machine. Check the "
            f"address (the one `python -m pwkernel.pool start` printed where the pool runs), "
            f"or start the pool here: python -m pwkernel.pool start --name {pool} "
            f"--islands 4,4.")


def token_advice(address: str, pool: str | None) -> str:
    """What went wrong when the cluster at ``address`` refused the token, and the fix."""
    env = os.environ
    if env.get("RAY_AUTH_MODE", "").lower() != "token":
        used = (f"no token (RAY_AUTH_MODE={env['RAY_AUTH_MODE']!r})" if "RAY_AUTH_MODE" in env
                else "no token")
    elif env.get("RAY_AUTH_TOKEN"):
        used = "the token in RAY_AUTH_TOKEN"
    elif env.get("RAY_AUTH_TOKEN_PATH"):
        used = f"the token in RAY_AUTH_TOKEN_PATH={env['RAY_AUTH_TOKEN_PATH']}"
    else:
        used = "the token in ~/.ray/auth_token"
    head = (f"the Ray cluster at {address!r} refused this process's token "
            f"(AuthenticationError: token missing or incorrect); it used {used}. ")
    if pool is not None:
        record = load(pool)
        path = record.get("token_path") if record else None
        if path and env.get("RAY_AUTH_TOKEN_PATH") != path:
            return head + (f"The token of pool {pool!r} is in {path}: unset RAY_AUTH_TOKEN and "
                           f"RAY_AUTH_TOKEN_PATH (the pool's file is used when they are not "
                           f"set), or set RAY_AUTH_TOKEN_PATH={path}.")
        if path:
            return head + (f"That is the token file of pool {pool!r} here, so the cluster at "
                           f"{address} is not that pool's: check the address (`python -m "
                           f"pwkernel.pool status --name {pool}` prints it).")
        return head + (f"Pool {pool!r} is not written down on this machine: set "
                       "RAY_AUTH_TOKEN_PATH to a copy of its token file (`python -m "
                       "pwkernel.pool start` printed its path on the pool's machine).")
    return head + ("Give this process the cluster's token: RAY_AUTH_TOKEN_PATH=<file> or "
                   "RAY_AUTH_TOKEN (`ray get-auth-token` on the cluster's head prints it), "
                   "with RAY_AUTH_MODE=token.")
