"""Start, inspect and stop a device pool: the functions behind ``python -m pwkernel.pool``.

A pool is a Ray cluster on this machine plus one long-lived (detached) island actor per island,
each holding its devices, every tenant's buffers and the island's gang scheduler
(``backends/ray/tenancy.py``). ``start`` starts the cluster (on 127.0.0.1, with a fresh token:
``head.py``) or joins the one at ``address``, places the islands and writes the pool file
(``backends/ray/poolfile.py``); then it disconnects and the pool runs on by itself until
``stop``. Controllers attach with ``pw.Controller(backend="ray", address=..., pool=NAME)``.

>>> record = start("class", (4, 4))                                  # doctest: +SKIP
>>> record["address"]                                                # doctest: +SKIP
'127.0.0.1:41233'
>>> [i["island"] for i in status("class")["islands"]]                # doctest: +SKIP
[0, 1]
>>> stop("class")["started_cluster"]                                 # doctest: +SKIP
True
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ..backends.ray import cluster, poolfile
from ..runtime.errors import DeviceSetupError
from ..runtime.sizes import sizes_problem
from . import head

PLATFORMS = ("auto", "cpu", "gpu")


class PoolError(DeviceSetupError):
    """A pool cannot be started, found, inspected or stopped as asked."""


class PoolRunningError(PoolError):
    """``start`` of a pool whose name already runs."""


def attach_hint(name: str, address: str) -> str:
    """How to attach to the pool, from Python and from a notebook."""
    return (f'pw.Controller(backend="ray", address="{address}", pool="{name}")\n'
            f"%pathways attach ray --address {address} --pool {name}")


def start(name: str, islands: Sequence[int], address: str | None = None, lease: float = 5.0,
          platform: str | None = None, port: int | None = None) -> dict[str, Any]:
    """Start pool ``name`` with ``islands`` (devices per island) and return its record.

    Without ``address`` the pool starts its own Ray cluster on 127.0.0.1 (``port``: its GCS
    port, default a free one); with it, it joins that cluster. ``lease``: seconds without a
    call from a tenant after which the pool drops it. ``platform``: ``gpu`` (islands are the
    cluster's GPUs), ``cpu`` (the host split into virtual devices) or ``auto`` (default,
    ``PWKERNEL_RAY_DEVICES`` or else gpu when the cluster has GPUs)."""
    poolfile.check_name(name)
    sizes = _sizes(islands)
    if not (isinstance(lease, int | float) and 0 < lease < float("inf")):
        raise PoolError(f"lease must be a positive number of seconds, got {lease!r}; e.g. 5")
    choice = _platform_choice(platform)
    if address is not None:
        check_address(address)
    with starting(name):
        _refuse_running(name)
        if address is not None and address != "auto" and not head.answers(address):
            raise PoolError(
                f"no Ray cluster answers at {address} (--address joins a running cluster: "
                "start its head there first, e.g. `ray start --head --port 6379`); or "
                f"leave --address out to start the pool's own cluster on 127.0.0.1: python "
                f"-m pwkernel.pool start --name {name} --islands "
                f"{','.join(map(str, sizes))}")
        return _start(name, sizes, address, float(lease), choice, port)


def check_address(address: str) -> str:
    """``address`` of a cluster to join: ``HOST:PORT`` (port 1 to 65535) or ``auto``."""
    problem = cluster.address_problem(str(address))
    if problem is not None:
        raise PoolError(problem)
    return address


def _start(name: str, sizes: tuple[int, ...], address: str | None, lease: float, choice: str,
           port: int | None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "name": name, "address": address, "token_path": None, "islands": list(sizes),
        "platform": None, "lease": float(lease), "started_cluster": address is None,
        "session_dir": None, "temp_dir": None, "pids": [], "started": time.time()}
    created = False  # island actors exist on a cluster we joined: a failure ends them
    try:
        if address is None:
            token = poolfile.new_token(name)
            record.update(head.start_head(name, token, port), token_path=str(token))
        else:
            record["token_path"] = _token_at_hand(name)
        poolfile.save(record)  # from here on `stop` finds what there is to end
        with connected(record) as gcs:
            record["address"] = gcs  # "auto" or a host name: the address Ray answers on
            record["platform"] = platform_for(sizes, choice, int(cluster.gpus_available()))
            from ..backends.ray import tenancy

            # (create_islands makes all islands or none, and refuses a name in use)
            infos = tenancy.create_islands(name, sizes, record["platform"], float(lease))
            created = True
        if record["started_cluster"]:  # the island actors are processes of our cluster too
            record["pids"] = sorted(set(record["pids"]) | {i["pid"] for i in infos
                                                           if i.get("pid")})
        poolfile.save(record)
    except BaseException:
        _teardown(record, created)
        raise
    return record


@contextlib.contextmanager
def starting(name: str) -> Iterator[None]:
    """Hold pool ``name``'s start lock: one ``start`` of a name at a time on this machine (an
    exclusive ``flock`` on ``.<NAME>.starting`` in the pool directory, let go by the kernel if
    the process dies). A second one is refused at once with ``PoolRunningError``."""
    folder = poolfile.pool_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / f".{poolfile.check_name(name)}.starting"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise PoolRunningError(
                f"pool {name!r} is being started right now by another process (pid {holder}); "
                f"wait for it to finish, then attach (see `python -m pwkernel.pool status "
                f"--name {name}`), or stop it: python -m pwkernel.pool stop --name {name}") \
                from None
        try:  # the file may have been removed (a start ended) between open and lock
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        path.unlink(missing_ok=True)  # (still locked: a waiter sees another file, tries again)
        os.close(fd)


def _refuse_starting(name: str) -> None:
    """Refuse to look at pool ``name`` while another process holds its start lock (its
    islands do not exist yet, which would read as lost): say who starts it."""
    holder = poolfile.start_holder(name)
    if holder is not None:
        raise PoolRunningError(poolfile.being_started(name, holder))


def status(name: str) -> dict[str, Any]:
    """Pool ``name``'s record and, under ``islands``, each island's ``pool_status()``
    (its devices, platform, pid, tenants, bytes held and launches); an island whose actor
    died is ``{"island", "devices", "lost": True, "tenants": []}`` (the others keep their
    numbers). While a ``start`` of the name runs, refused with ``PoolRunningError``."""
    _refuse_starting(name)
    record = _record(name)
    _require_answer(record)
    import ray

    from ..backends.ray import attach

    with connected(record):
        handles = attach.island_actors(name)
        refs = {i: h.pool_status.remote() for i, h in handles.items()}
        islands = {}
        for i, ref in refs.items():
            try:
                islands[i] = ray.get(ref, timeout=60)
            except ray.exceptions.RayActorError:
                continue  # died: shown lost below
    for i, size in enumerate(record["islands"]):
        if i not in islands:
            islands[i] = {"island": i, "devices": size, "lost": True, "tenants": []}
    return dict(record, islands=[islands[i] for i in sorted(islands)], sizes=record["islands"])


def stop(name: str) -> dict[str, Any]:
    """End pool ``name``: its island actors, and the Ray cluster's processes when the pool
    started it (never another cluster's); its pool file and token go. Returns what it did:
    ``islands_ended`` (bool), ``processes_ended`` (pids), ``started_cluster``."""
    record = _record(name)
    ended_islands = False
    if record.get("address") and head.answers(record["address"]):
        try:
            with connected(record):
                from ..backends.ray import tenancy

                tenancy.destroy_islands(name)
                ended_islands = True
        except Exception:  # noqa: BLE001 - Ray's errors are varied
            if not record.get("started_cluster"):
                raise  # a cluster we joined: its actors must go before we forget the pool
    pids = head.stop_head(record) if record.get("started_cluster") else []
    poolfile.remove(name)
    return {"name": name, "islands_ended": ended_islands or bool(pids),
            "processes_ended": pids, "started_cluster": bool(record.get("started_cluster"))}


@contextlib.contextmanager
def connected(record: dict[str, Any]) -> Iterator[str]:
    """This process as a Ray driver of the pool's cluster, with the pool's token; yields the
    GCS address Ray answers on. A Ray connection this process had before is used (it must
    be the pool's cluster) and left."""
    import ray

    address = record["address"]
    if ray.is_initialized():
        gcs = ray.get_runtime_context().gcs_address
        if address not in (gcs, "auto"):
            raise PoolError(
                f"this process is connected to the Ray cluster at {gcs}, not to pool "
                f"{record['name']!r}'s at {address}; run `python -m pwkernel.pool ...` in a "
                "shell, or close the controllers of this process first.")
    cluster.connect(address, pool=record["name"], own_token=True)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        cluster.disconnect()


def _sizes(islands: Sequence[int]) -> tuple[int, ...]:
    try:
        sizes = tuple(int(n) for n in islands)
        ok = sizes and all(int(n) == n and n > 0 for n in islands)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise PoolError(f"islands must be positive device counts, one per island, got "
                        f"{islands!r}; e.g. --islands 4,4")
    problem = sizes_problem(sizes)
    if problem is not None:
        raise PoolError(f"{problem}; e.g. --islands 4,4")
    return sizes


def _platform_choice(platform: str | None) -> str:
    chosen = platform if platform is not None else os.environ.get("PWKERNEL_RAY_DEVICES")
    chosen = (chosen or "auto").strip().lower()
    if chosen not in PLATFORMS:
        where = "platform" if platform is not None else "PWKERNEL_RAY_DEVICES"
        raise PoolError(f"{where}={chosen!r}; expected one of {', '.join(PLATFORMS)}.")
    return chosen


def platform_for(sizes: tuple[int, ...], choice: str, gpus: int) -> str:
    """cpu or gpu for a cluster with ``gpus`` GPUs: an island's devices are GPUs when the
    cluster has any (or when asked: ``choice``), and then the islands must fit in them."""
    needed = sum(sizes)
    if choice == "cpu" or (choice == "auto" and gpus == 0):
        return "cpu"
    if gpus < needed:
        sizes_text = ",".join(map(str, sizes))
        raise PoolError(
            f"the pool's Ray cluster has {gpus} GPUs and --islands {sizes_text} needs "
            f"{needed}; "
            + (f"ask for at most {gpus} (e.g. --islands {gpus}), add GPU machines to the "
               "cluster, " if gpus else "add GPU machines to the cluster ")
            + "or pass --platform cpu for virtual CPU devices.")
    return "gpu"


def _token_at_hand(name: str) -> str | None:
    """Joining a cluster: the token this process would use (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``), copied into the pool's token file so
    that tenants on this machine find it; None when there is none."""
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if not token:
        path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
        try:
            with open(path) as f:
                token = f.read().strip()
        except OSError:
            token = ""
    return str(poolfile.write_token(name, token)) if token else None


def _refuse_running(name: str) -> None:
    """A pool of that name that runs is refused; one whose cluster is gone is cleaned up."""
    record = poolfile.load(name)
    if record is None:
        return
    if record.get("address") and head.answers(record["address"]):
        raise PoolRunningError(
            f"pool {name!r} runs already at {record['address']} (pool file "
            f"{poolfile.file_path(name)}). Attach with\n{attach_hint(name, record['address'])}"
            f"\nor stop it first: python -m pwkernel.pool stop --name {name}")
    _teardown(record, False)  # its cluster is gone: what is left of it goes too


def _teardown(record: dict[str, Any], created: bool) -> None:
    """Undo a start that failed: the cluster it started, or the actors it made on one it
    joined; then its files."""
    if record.get("started_cluster"):
        head.stop_head(record)
    elif created and record.get("address"):
        with contextlib.suppress(Exception):
            with connected(record):
                from ..backends.ray import tenancy

                tenancy.destroy_islands(record["name"])
    poolfile.remove(record["name"])


def _record(name: str) -> dict[str, Any]:
    record = poolfile.load(name)
    if record is None:
        raise PoolError(
            f"no pool named {name!r} on this machine (pool directory {poolfile.pool_dir()}; "
            f"set {poolfile.ENV} if it is elsewhere). Start one with `python -m pwkernel.pool "
            f"start --name {name} --islands 4,4`.")
    return record


def _require_answer(record: dict[str, Any]) -> None:
    if not head.answers(record["address"]):
        raise PoolError(
            f"pool {record['name']!r}'s Ray cluster at {record['address']} does not answer: "
            f"it stopped. Clean up with `python -m pwkernel.pool stop --name {record['name']}`, "
            "then start it again.")
