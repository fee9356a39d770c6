"""The real ``pwkernel`` kernel from a test: notebooks executed by nbclient (``notebook``,
``execute``, what a cell showed, its errors) and a frontend's comm over jupyter_client's
channels (``CommClient``, ``run_code``). The ``kernel`` fixture is in tests/notebook/conftest.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from pwkernel.notebook import comm, kernelspec


def notebook(*sources: str):
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])


def text(cell) -> str:
    """Everything a cell showed: streams, plain-text reprs and errors."""
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.data.get("text/plain", ""))
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
    return "\n".join(parts)


def _kernel_stacks(km) -> str:
    """Every thread's Python stack in the kernel's process (py-spy), or why there is none."""
    process = getattr(getattr(km, "provisioner", None), "process", None)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if process is None or not Path(spy).exists():
        return "(no kernel process or no py-spy to read its stacks)"
    try:
        done = subprocess.run([spy, "dump", "--pid", str(process.pid)], capture_output=True,
                              text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return "(py-spy did not answer in 60 s)"
    return done.stdout + done.stderr


class _StacksOnTimeout:
    """On a cell's timeout, print the kernel's thread stacks (pytest shows them with the
    failure) before nbclient shuts the kernel down: a hang is then explained by the run that
    had it, not left to a rerun that may not."""

    async def _async_handle_timeout(self, timeout, cell=None):
        print(f"kernel threads at the {timeout} s timeout:\n{_kernel_stacks(self.km)}",
              file=sys.stderr)
        return await super()._async_handle_timeout(timeout, cell)


def execute(nb, client_cls=NotebookClient, **kw):
    cls = type(f"{client_cls.__name__}WithStacks", (_StacksOnTimeout, client_cls), {})
    client = cls(nb, **{"kernel_name": kernelspec.NAME, "timeout": 240, "allow_errors": True,
                        "startup_timeout": 120, **kw})
    client.execute()
    return nb


def cell_errors(nb) -> list[str]:
    """Each error a notebook's cells raised, with the cell and its traceback's end; a magic's
    ``UsageError`` too (IPython writes it to stderr, with no error output)."""
    out = []
    for i, cell in enumerate(nb.cells):
        where = f"cell {i} ({cell.source.splitlines()[0][:60]!r})"
        for o in cell.get("outputs", []):
            if o.output_type == "error":
                tb = "\n".join(o.get("traceback", [])[-6:])
                out.append(f"{where}: {o.ename}: {o.evalue}\n{tb}")
            elif o.output_type == "stream" and o.name == "stderr" and "UsageError:" in o.text:
                out.append(f"{where}: {o.text[-2000:]}")
    return out


class CommClient:
    """The frontend's half of one comm, over a real kernel's channels."""

    def __init__(self, kc, comm_id: str):
        self.kc, self.id = kc, comm_id

    def send(self, msg_type: str, content: dict) -> None:
        self.kc.shell_channel.send(self.kc.session.msg(msg_type, content))

    def open(self, data: dict) -> None:
        self.send("comm_open", {"comm_id": self.id, "target_name": comm.TARGET, "data": data})

    def request(self, data: dict) -> None:
        self.send("comm_msg", {"comm_id": self.id, "data": data})

    def close(self) -> None:
        self.send("comm_close", {"comm_id": self.id, "data": {}})

    def next(self, pred=lambda d: True, timeout: float = 60) -> dict:
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            if msg["msg_type"] == "comm_msg" and msg["content"]["comm_id"] == self.id:
                data = msg["content"]["data"]
                if pred(data):
                    return data


def run_code(kc, code: str) -> str:
    """Execute ``code``; returns its stdout (fails on an error)."""
    outputs: list[dict] = []
    reply = kc.execute_interactive(code, timeout=120, output_hook=outputs.append)
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
