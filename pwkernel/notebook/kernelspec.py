"""The ``pwkernel`` Jupyter kernel: IPython with ``%load_ext pwkernel`` already done.

    python -m pwkernel.notebook.kernelspec install          # into sys.prefix (the venv)
    python -m pwkernel.notebook.kernelspec install --prefix /some/prefix
    python -m pwkernel.notebook.kernelspec show             # print kernel.json

The kernel runs ``sys.executable -m ipykernel_launcher -f {connection_file} --ext pwkernel``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

NAME = "pwkernel"
DISPLAY_NAME = "Pathways (JAX)"


def spec(python: str | None = None) -> dict:
    """The kernel.json contents."""
    return {
        "argv": [python or sys.executable, "-m", "ipykernel_launcher", "-f",
                 "{connection_file}", "--ext", "pwkernel"],
        "display_name": DISPLAY_NAME,
        "language": "python",
        "metadata": {"debugger": True},
    }


def install(prefix: str | None = None, user: bool = False) -> Path:
    """Install the kernelspec (default: into ``sys.prefix``); returns its directory."""
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kernel.json").write_text(json.dumps(spec(), indent=1))
        dest = KernelSpecManager().install_kernel_spec(
            tmp, NAME, user=user, prefix=None if user else (prefix or sys.prefix))
    return Path(dest)


def write(directory: str | Path) -> Path:
    """Write the kernelspec under ``directory/kernels/pwkernel`` (for a JUPYTER_PATH entry)."""
    dest = Path(directory) / "kernels" / NAME
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "kernel.json").write_text(json.dumps(spec(), indent=1))
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pwkernel.notebook.kernelspec")
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("install", help="install the 'pwkernel' kernelspec")
    where = i.add_mutually_exclusive_group()  # (--user used to win over --prefix unsaid)
    where.add_argument("--prefix", default=None, help="default: sys.prefix (this environment)")
    where.add_argument("--user", action="store_true", help="into the user's Jupyter directory")
    sub.add_parser("show", help="print kernel.json")
    a = p.parse_args(argv)
    if a.command == "show":
        print(json.dumps(spec(), indent=1))
        return 0
    dest = install(a.prefix, a.user)
    print(f"installed kernelspec {NAME!r} ({DISPLAY_NAME}) in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
