"""Fuzzing the notebook's two front doors with Hypothesis.

- ``%pathways`` / ``%%pathways`` argument strings: every one either works or raises a one-line
  ``UsageError`` (a ``--timeout`` that runs out is working as asked), and the shell keeps
  working afterwards.
- comm messages: every one gets exactly one JSON reply, short unless it is a status, with the
  request's id when the id is valid; nothing is run, written outside the notebook's directory
  or over a file.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

import pwkernel as pw
from pwkernel.notebook import comm, extension
from pwkernel.notebook.magics import CellTimeout

FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

# --- argument strings ----------------------------------------------------------------------
NUMBERS = ["0", "1", "2", "-1", "3", "8", "0.001", "1e-300", "1e308", "1e400", "inf", "-inf",
           "nan", "1e10", "31536000", "99999999999999999999", "0x10", "1_000", "+2", "2.5"]
SHAPES = ["2", "2x2", "2,2", "1x1x1", "2x", "x2", "2xx2", ",2", "2,", "0", "9", "4x4", "2*2",
          "1,1,1,1", "-2", "2x-1", "２"]
WORDS = ["s0", "s1", "t", "alice", "''", '""', "'", '"', "\\", "a b", "'a b'", "--", "-", "=",
         "fifo", "share", "priority", "lifo", "parallel", "sequential", "save", "clear",
         "local", "t.json", "dir/t.json", "x,y", "data,model", ",", "1abc", "é", "\t", "#",
         "$HOME", "{}", "--help", "-h"]
LINE_COMMANDS = ["", "status", "slice", "release", "policy", "dispatch", "client", "trace",
                 "reset", "attach", "frobnicate"]
LINE_FLAGS = ["--island", "--axes", "--weight", "--priority", "--address", "--islands"]
CELL_FLAGS = ["--slice", "--devices", "--island", "--client", "--weight", "--priority",
              "--sequential", "--no-block", "--timeout", "--viz", "--bogus"]
# Not "/" (trace save would write anywhere) nor what ends a line for IPython (str.splitlines).
NOISE = st.text(alphabet=st.characters(
    blacklist_characters="/\x00\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029",
    blacklist_categories=("Cs",)), max_size=12)


def _tokens(flags: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(flags or WORDS), st.sampled_from(NUMBERS),
                     st.sampled_from(SHAPES), st.sampled_from(WORDS),
                     NOISE.filter(lambda s: s.strip() != "ray"))


def _pick(*options: str) -> st.SearchStrategy[str]:
    return st.sampled_from(options)


def _flag(name: str, values: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.just(""), _pick(*values).map(lambda v: f"{name} {v}"))


def _line(*parts: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.tuples(*parts).map(lambda ps: " ".join(p for p in ps if p))


NAMES = ["s0", "s1", "t"]
SHAPE = re.compile(r"[1-9][0-9]*([xX*][1-9][0-9]*)*|[1-9][0-9]*(,[1-9][0-9]*)*")  # the spec
structured_line = st.one_of(
    _line(st.just("status")), _line(st.just("reset")),
    _line(st.just("slice"), _pick(*NAMES), _pick(*SHAPES), _flag("--island", ["0", "1", "2"]),
          _flag("--axes", ["x", "x,y", "data,model"])),
    _line(st.just("release"), _pick(*NAMES)),
    _line(st.just("policy"), _pick("fifo", "priority", "share")),
    _line(st.just("dispatch"), _pick("parallel", "sequential")),
    _line(st.just("client"), _pick("alice", "bob"), _flag("--weight", NUMBERS),
          _flag("--priority", NUMBERS)),
    _line(st.just("trace"), _pick("save", "clear"), _pick("t.json", "sub/t.json", "")),
    _line(st.just("attach"), st.just("local"), _flag("--islands", ["4,4", "2,2", *SHAPES])),
)
random_line = st.builds(lambda head, rest: " ".join([head, *rest]),
                        st.sampled_from(LINE_COMMANDS), st.lists(_tokens(LINE_FLAGS), max_size=6))
line_args = st.one_of(structured_line, structured_line, random_line)
WHERE = ["", "--slice s0", "--devices 1", "--devices 2 --island 1", "--devices 4"]
structured_cell = _line(
    _pick(*WHERE), _flag("--client", ["alice", "bob"]),
    _flag("--weight", ["1", "2", "0.5"]), _flag("--priority", ["0", "3", "-1"]),
    st.sampled_from(["", "--sequential"]), st.sampled_from(["", "--no-block"]),
    _flag("--timeout", ["0.001", "5", "60"]), st.sampled_from(["", "--viz"]))
cell_args = st.one_of(structured_cell, structured_cell,
                      st.lists(_tokens(CELL_FLAGS), max_size=7).map(" ".join))


def _outcome(ip, source: str) -> BaseException | None:
    result = ip.run_cell(source)
    return result.error_before_exec or result.error_in_exec


def _one_line_usage_error(err: BaseException | None, source: str, seen: Counter) -> None:
    seen["works" if err is None else "refused"] += 1
    if err is None:
        return
    assert isinstance(err, UsageError), f"{source!r} raised {type(err).__name__}: {err}"
    assert "\n" not in str(err), f"{source!r}: a multi-line message:\n{err}"


@pytest.fixture
def fuzz_shell(ip, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # trace save writes here, nowhere else
    ip.user_ns["fz_in"] = np.arange(4, dtype=np.float32)
    _outcome(ip, "%pathways slice s0 2")
    return ip


def _still_works(ip) -> None:
    ctl = extension.state().controller()
    assert ctl.wait(timeout=120)
    assert _outcome(ip, "%pathways status") is None
    assert _outcome(ip, "%%pathways --devices 1\nfz_ok = fz_in + 1") is None
    assert ip.user_ns["fz_ok"].result(timeout=60).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_line_magic_arguments_work_or_are_refused(fuzz_shell):
    ip, seen = fuzz_shell, Counter()

    @FUZZ
    @given(line_args)
    def one(line):
        source = f"%pathways {line}"
        err = _outcome(ip, source)
        _one_line_usage_error(err, source, seen)
        words = line.split()
        if err is None and words[:1] == ["slice"]:  # only N, NxM..., N,M... of positive ints
            assert SHAPE.fullmatch(words[2]), f"{source!r} made a slice"
        assert _outcome(ip, "%%pathways\nfz_ok = fz_in + 1") is None, f"after {source!r}"

    one()
    print(dict(seen))
    assert seen["works"] >= 10 and seen["refused"] >= 10, seen  # both sides were explored
    _still_works(ip)


def test_cell_magic_arguments_work_or_are_refused(fuzz_shell):
    ip, seen = fuzz_shell, Counter()

    @FUZZ
    @given(cell_args, st.sampled_from(["fz_out = fz_in * 2", "fz_plain = 1"]))
    def one(line, body):
        ip.user_ns.pop("fz_out", None)
        source = f"%%pathways {line}\n{body}"
        err = _outcome(ip, source)
        if isinstance(err, CellTimeout | pw.CancelledError):
            seen["timed out"] += 1
            return  # a --timeout that ran out: honoured
        _one_line_usage_error(err, source, seen)
        if err is None and body.startswith("fz_out"):
            out = ip.user_ns["fz_out"]
            try:
                value = out.result(timeout=60)
            except pw.CancelledError:
                assert "--timeout" in line  # --no-block --timeout cancelled it
            else:
                assert np.asarray(value).tolist() == [0.0, 2.0, 4.0, 6.0]
        extension.state().controller().wait(timeout=60)

    one()
    print(dict(seen))
    assert seen["works"] >= 10 and seen["refused"] >= 10, seen
    _still_works(ip)


# --- comm messages -------------------------------------------------------------------------
FIELDS = ["type", "id", "interval", "policy", "dispatch", "run", "path", "data", "verbose"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)
field_values = st.one_of(json_values, st.sampled_from(
    [*comm.REQUESTS, "fifo", "share", "parallel", 0, 1, 0.5, 1e9, "t.json", "../t.json",
     "/tmp/t.json", "x" * 300 + ".json", "a.txt", "", "x" * 5000]))
messages = st.one_of(
    json_values,
    st.dictionaries(st.sampled_from(FIELDS), field_values, max_size=4),
    st.builds(lambda kind, rest: {**rest, "type": kind},
              st.sampled_from([*comm.REQUESTS, "launch", "x" * 5000]),
              st.dictionaries(st.sampled_from(FIELDS[1:]), field_values, max_size=3)),
)


def _valid_id(v) -> bool:
    """The protocol's ids: an int a JavaScript number holds exactly, or a short string."""
    return (isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**53) or (
        isinstance(v, str) and len(v) <= 200)


def test_every_comm_message_gets_one_short_reply_and_runs_nothing(ctl, tmp_path, monkeypatch):
    root = tmp_path / "nb"
    root.mkdir()
    monkeypatch.chdir(root)  # the kernel's working directory: the notebook's
    (root / "t.json").write_text("already here")
    sent: list[dict] = []

    def send(msg: dict) -> None:
        if threading.current_thread().name != "pwkernel-comm-updater":  # not a push
            sent.append(msg)

    conn = comm.Connection(send, lambda: ctl)

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(messages)
    def one(msg):
        sent.clear()
        out = conn.handle(msg)
        assert sent == [out]  # exactly one reply, the one returned
        text = json.dumps(out, allow_nan=False)
        assert out["type"] == "status" or len(text) < 1000, text[:300]
        valid_id = isinstance(msg, dict) and _valid_id(msg.get("id"))
        assert ("id" in out) == valid_id and (not valid_id or out["id"] == msg["id"])
        if out["type"] != "error":
            assert out["type"] == ("status" if msg["type"] == "subscribe" else msg["type"])

    try:
        one()
    finally:
        conn.close()
    assert ctl.runs() == [] and len(ctl.trace) == 0  # no program ran
    assert (root / "t.json").read_text() == "already here"
    assert all(name.endswith(".json") for name in os.listdir(root))
    assert sorted(os.listdir(tmp_path)) == ["nb"]  # nothing written beside the notebook dir
