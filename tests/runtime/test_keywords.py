"""A misspelt keyword to the public API names the one meant and what the call takes; an
argument of the wrong kind says what it must be and how to fix it."""

from __future__ import annotations

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pwkernel as pw
from pwkernel.runtime.keywords import suggests_keywords


def _meant(name: str, bad: str, good: str) -> str:
    return (rf"{name}\(\) got an unexpected keyword argument '{bad}'\. Did you mean {good}=\? "
            rf"{name}\(\) takes: .*\b{good}\b")


def test_runtime_calls_name_the_keyword_meant(ctl):
    # (each was Python's bare "got an unexpected keyword argument", naming no right word)
    s = ctl.slice(2, island=0)
    calls = [
        ("pw.Controller", "island", "islands", lambda: pw.Controller(island=(2,))),
        ("ctl.slice", "iland", "island", lambda: ctl.slice(2, iland=0)),
        ("ctl.remap", "islands", "island", lambda: ctl.remap(s, islands=1)),
        ("ctl.client", "wieght", "weight", lambda: ctl.client("a", wieght=2).__enter__()),
        ("ctl.wait", "timout", "timeout", lambda: ctl.wait(timout=1)),
        ("pw.function", "in_spec", "in_specs",
         lambda: pw.function(lambda x: x, slice=s, in_spec=P())),
        ("pw.program", "static_argnum", "static_argnums",
         lambda: pw.program(lambda v: v, static_argnum=0)),
        ("pw.controller", "memory_bugdet", "memory_budget",
         lambda: pw.controller(memory_bugdet=1)),
        ("pw.Link", "bandwith", "bandwidth", lambda: pw.Link(bandwith=1e9)),
        ("ctl.trace.events", "snce", "since", lambda: ctl.trace.events(snce=0)),
        ("ctl.trace.save", "row", "rows", lambda: ctl.trace.save("t.json", row="device")),
    ]
    for name, bad, good, call in calls:
        with pytest.raises(TypeError, match=_meant(name, bad, good)):
            call()


def test_a_keyword_with_nothing_close_lists_what_the_call_takes(ctl):
    with pytest.raises(TypeError, match=r"ctl.slice\(\) got an unexpected keyword argument "
                                        r"'zzz'\. ctl.slice\(\) takes: shape, island, "
                                        r"axis_names, axis_types, devices, replacing\.$"):
        ctl.slice(2, zzz=0)


def test_only_the_calls_own_keyword_error_is_rewritten():
    """A TypeError from inside the call, about another function's keywords, passes as it came
    (its traceback has the inner frame), and a good call is the function's own."""
    def inner(a):
        return a

    @suggests_keywords("pw.outer")
    def outer(x, *, extra=0):
        """The docs."""
        return inner(b=x)

    with pytest.raises(TypeError, match=r"^.*inner\(\) got an unexpected keyword argument 'b'$"):
        outer(1)
    with pytest.raises(TypeError, match=r"pw.outer\(\) got .* 'extr'\. Did you mean extra=\?"):
        outer(1, extr=2)
    assert outer.__doc__ == "The docs." and outer.__name__ == "outer"

    @suggests_keywords("pw.fine")
    def fine(x, *, extra=0):
        return x + extra
    assert fine(1, extra=2) == 3


def test_an_island_that_is_no_int_says_so(ctl):
    # (island="0" said "island '0' does not exist", which reads as if "0" were a good id)
    with pytest.raises(pw.SliceError, match=r"island must be an int \(an island's id: 0 to 1"
                                            r"\), got str '0'\. Maybe you want island=0\."):
        ctl.slice(2, island="0")
    with pytest.raises(pw.SliceError, match=r"island must be an int .*got float 1.0\. Maybe "
                                            r"you want island=1\."):
        ctl.remap(ctl.slice(1), island=1.0)


def test_trace_enabled_takes_a_bool(ctl):
    # ("no" was taken as True: the trace kept recording)
    with pytest.raises(TypeError, match=r"trace.enabled must be True or False, got str 'no'"):
        ctl.trace.enabled = "no"
    assert ctl.trace.enabled is True
    with pytest.raises(TypeError, match="must be True or False, got int 0"):
        pw.Trace(enabled=0)
    ctl.trace.enabled = False
    ctl.trace.clear()
    pw.function(lambda x: x + 1, slice=ctl.slice(1))(np.ones(2)).result()
    assert ctl.trace.events() == [] and ctl.trace.enabled is False
    ctl.trace.enabled = True
    pw.function(lambda x: x + 1, slice=ctl.slice(1))(np.ones(2)).result()
    assert ctl.trace.events()


@pytest.mark.parametrize("option, nums, fix", [
    ("static_argnums", 2, r"Maybe you want static_argnums=1 \(positions count from 0\)"),
    ("donate_argnums", (0, 3), r"positions count from 0: x is 0, y is 1, and from the end: y "
                               r"is -1.*donate_argnames=\('y',\)"),
    ("static_argnums", -3, r"x is -2"),
])
def test_argnums_out_of_range_say_how_to_count(ctl, option, nums, fix):
    # (these said the function's positional arguments, not how to name the one meant)
    with pytest.raises(ValueError, match=fix):
        pw.function(lambda x, y: x + y, slice=ctl.slice(1), **{option: nums})


def test_a_warning_still_points_at_the_line_that_made_the_controller(ctl):
    # (the keyword check's frame is not the user's: the warning named keywords.py)
    with pytest.warns(pw.SharedDevicesWarning) as seen:
        other = pw.Controller(islands=(4, 4))
    other.close()
    assert seen[0].filename == __file__
