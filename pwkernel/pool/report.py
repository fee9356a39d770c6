"""``python -m pwkernel.pool``'s words: a started pool, and a pool's status, for people."""

from __future__ import annotations

from typing import Any

from ..runtime.units import device_ids, human_bytes, human_seconds
from .service import attach_hint


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """Columns padded to their widest cell."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in cells]


def _where(record: dict[str, Any]) -> str:
    own = "its own cluster" if record["started_cluster"] else "a cluster it joined"
    return (f"at {record['address']} ({own}; tenants silent for {record['lease']:g} s are "
            "dropped)")


def started(record: dict[str, Any]) -> str:
    """What ``start`` prints: where the pool is, its token file, how to attach and stop."""
    name = record["name"]
    sizes = ", ".join(f"island {i}: {n} {record['platform']}"
                      for i, n in enumerate(record["islands"]))
    token = record["token_path"] or "(none: the cluster does not use token authentication)"
    return "\n".join([
        f"pool {name!r} runs {_where(record)}: {sizes}",
        f"address:    {record['address']}",
        f"token file: {token} (owner-only; controllers on this machine find it by the pool's "
        "name)",
        "attach:",
        *("  " + line for line in attach_hint(name, record["address"]).splitlines()),
        f"status:     python -m pwkernel.pool status --name {name}",
        f"stop:       python -m pwkernel.pool stop --name {name}",
    ])


def status_text(st: dict[str, Any]) -> str:
    """What ``status`` prints: the pool, its islands, and every island's tenants."""
    islands = [[i["island"], i["devices"], "lost (its actor died)", "-", "-", "-"]
               if i.get("lost") else
               [i["island"], i["devices"], i["platform"], i["pid"], i["launches"],
                human_bytes(i["bytes"])] for i in st["islands"]]
    tenants = [[t["name"], t.get("key") or f"{i['island']}:{t['tenant']}", i["island"],
                t["queued"], t["running"], human_seconds(t["device_seconds"]),
                f"{100 * t['share']:.0f}%", human_bytes(t["bytes"]), device_ids(t["devices"])]
               for i in st["islands"] for t in i["tenants"]]
    lines = [f"pool {st['name']!r} {_where(st)}", f"token file: {st['token_path']}", ""]
    lines += table(["island", "devices", "platform", "pid", "launches", "memory"], islands)
    lines.append("")
    if tenants:
        lines += table(["tenant", "id", "island", "queued", "running", "device time",
                        "share", "memory", "devices"], tenants)
    else:
        lines.append("tenants: none (attach with: " + attach_hint(
            st["name"], st["address"]).splitlines()[0] + ")")
    return "\n".join(lines)


def stopped(done: dict[str, Any]) -> str:
    """What ``stop`` prints."""
    name = done["name"]
    if done["started_cluster"]:
        return (f"pool {name!r} stopped: its island actors and its Ray cluster "
                f"({len(done['processes_ended'])} processes) ended; pool file and token removed")
    return (f"pool {name!r} stopped: its island actors ended (the Ray cluster it joined runs "
            "on); pool file and token removed")
