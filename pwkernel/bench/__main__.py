"""``python -m pwkernel.bench NAME [--quick|--tiny] [--json PATH] [--plot PATH]``.

NAME: dispatch, parallel-dispatch, pipeline, multitenancy, dcn, tracing, sim-paper, train,
pool, or all (every one but pool, which starts a Ray cluster and processes of its own).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import jax

# Before anything initializes JAX's backend: the controllers need 8 host devices on CPU.
jax.config.update("jax_num_cpu_devices", 8)

from .harness import write_json  # noqa: E402
from .runner import BENCHMARKS, NOT_IN_ALL, resolve, run_benchmarks  # noqa: E402

ISLANDS_VARIABLE = "PWKERNEL_BENCH_ISLANDS"


def _exit_on_sigterm(signum, frame) -> None:
    """SIGTERM (``timeout``, a job scheduler, ``kill``) ends a run as Ctrl-C does: by an
    exception in the main thread, so what it started (the pool benchmark's Ray cluster and
    tenant processes, controllers) is stopped on the way out, not left running."""
    raise SystemExit(128 + signum)


def _check_islands(parser: argparse.ArgumentParser, how: str, raw: str) -> None:
    try:
        sizes = [int(x) for x in raw.replace(" ", "").split(",") if x]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        parser.error(f"{how} takes device counts per island, e.g. 4,4 or 1; got {raw!r}.")
    have = len(jax.devices())
    if sum(sizes) > have:
        parser.error(f"{how} {raw} needs {sum(sizes)} devices; JAX has {have} here (the "
                     "benchmarks split a CPU-only host into 8).")


def _check(parser: argparse.ArgumentParser, args) -> None:
    """Refuse what would fail only once the benchmarks have run."""
    try:
        resolve(args.names)
    except ValueError as e:
        parser.error(str(e))
    if args.plot and not {"dispatch", "all"} & set(args.names):
        parser.error("--plot draws the dispatch benchmark; run 'dispatch' (or 'all').")
    if args.islands:
        _check_islands(parser, "--islands", args.islands)
    elif os.environ.get(ISLANDS_VARIABLE, "").strip():  # what --islands sets, from outside
        _check_islands(parser, f"{ISLANDS_VARIABLE} (the environment; --islands overrides it)",
                       os.environ[ISLANDS_VARIABLE])
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            if Path(path).is_dir():
                example = Path(path) / ("results.json" if flag == "--json" else "dispatch.png")
                parser.error(f"{flag} {path} is a folder; give a file name in it, e.g. "
                             f"{example}.")
            folder = Path(path).resolve().parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                parser.error(f"{flag} {path}: cannot make its folder ({e.strerror}).")
            if not os.access(folder, os.W_OK):
                parser.error(f"{flag} {path}: its folder {folder} is not writable.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pwkernel.bench",
        description="Benchmarks reproducing the Pathways paper's evaluation, beside bare JAX. "
                    "A benchmark that fails is reported and the others still run; the JSON "
                    "lists it under 'failed' and the exit status is 1.")
    parser.add_argument("names", nargs="+", metavar="NAME",
                        help=f"one or more of {', '.join(BENCHMARKS)}, or all (all but "
                             f"{', '.join(NOT_IN_ALL)})")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="about a minute per benchmark")
    size.add_argument("--tiny", action="store_true", help="seconds: proves it runs (tests)")
    parser.add_argument("--islands", metavar="N[,N...]",
                        help="devices per island for the dispatch and multitenancy "
                             "benchmarks (default 4,4; 1 on a machine with one GPU)")
    parser.add_argument("--json", metavar="PATH",
                        help="write the results as JSON here (also what finished when a run "
                             "is interrupted)")
    parser.add_argument("--plot", metavar="PATH",
                        help="write a PNG of the dispatch benchmark here (needs 'dispatch')")
    args = parser.parse_args(argv)
    _check(parser, args)  # before minutes of measuring, not after
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    if args.islands:
        os.environ[ISLANDS_VARIABLE] = args.islands
    payload: dict = {"command": " ".join(["python -m pwkernel.bench",
                                          *(sys.argv[1:] if argv is None else argv)])}
    try:
        run_benchmarks(args.names, mode, progress=lambda s: print(s, flush=True),
                       payload=payload)
    except BaseException as e:  # Ctrl-C, SIGTERM: keep what finished, then stop as asked
        if args.json and payload.get("benchmarks"):
            payload["interrupted"] = {"by": type(e).__name__, "during": payload.pop("running",
                                                                                    None)}
            print(f"interrupted: wrote what finished to {write_json(args.json, payload)}",
                  file=sys.stderr, flush=True)
        raise
    if args.json:
        print(f"wrote {write_json(args.json, payload)}")
    if args.plot:
        if "dispatch" in payload["failed"]:
            print(f"no plot: the dispatch benchmark failed, so {args.plot} was not written.",
                  file=sys.stderr)
        else:
            from .plot import dispatch_png

            print(f"wrote {dispatch_png(payload['benchmarks']['dispatch'], args.plot)}")
    if payload["failed"]:
        print(f"failed: {', '.join(payload['failed'])} (the error and traceback of each are "
              "above" + (", and in the JSON under 'benchmarks')" if args.json else ")"),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.exit(main())
