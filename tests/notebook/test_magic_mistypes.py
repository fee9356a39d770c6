"""Mistyped magics: each says, in the magics' own words, what was expected and how to fix it,
and leaves the kernel's controller and slices as they were."""

from __future__ import annotations

import re

import pytest
from IPython.core.error import UsageError

from pwkernel.notebook import extension
from tests.helpers.shell import run


def _state(ip) -> tuple:
    st = extension.state()
    return (st.ctl, st.ctl.backend, sorted((n, vs.device_ids) for n, vs in st.slices.items()),
            st.client, st.ctl.policy, st.ctl.dispatch)


@pytest.mark.parametrize("line, says, never", [
    # a --devices cell too large: the fix is the cell's own flags (it said ctl.slice(4))
    ("%%pathways --devices 9\ny = 1", "maybe you want %%pathways --devices 4,", "ctl.slice"),
    ("%%pathways --devices 9 --island 1\ny = 1", "Maybe you want %%pathways --devices 4 "
     "--island 1,", "ctl.slice"),
    # --address is Ray's: the magic's flags, not pw.Controller's keywords (ray_address=)
    ("%pathways attach sim --address 127.0.0.1:6379", "%pathways attach sim takes no "
     "--address; use %pathways attach ray --address A for a Ray cluster.", "ray_address"),
    # --slice with --devices: what each does, and to keep one
    ("%%pathways --slice s0 --devices 2\ny = 1", "--slice and --devices exclude each other: "
     "--slice NAME runs the cell on the slice made with %pathways slice NAME SHAPE, "
     "--devices N on a fresh slice of N devices. Keep one of them.", "Did you mean"),
    # a flag of the other magic says whose it is
    ("%%pathways --axes x\ny = 1", "--axes goes with %pathways slice, not with %%pathways.",
     "Did you mean"),
    ("%%pathways --tenant bob\ny = 1", "--tenant goes with %pathways attach, not with "
     "%%pathways.", "Did you mean"),
    ("%pathways slice t 2 --timeout 3", "--timeout goes with %%pathways (the cell magic), "
     "not with %pathways slice.", "Did you mean"),
    ("%pathways client bob --no-block", "--no-block goes with %%pathways (the cell magic), "
     "not with %pathways client.", "Did you mean"),
])
def test_a_mistyped_magic_names_the_fix_and_changes_nothing(ip, line, says, never):
    run(ip, "%pathways slice s0 2")
    before = _state(ip)
    with pytest.raises(UsageError) as err:
        run(ip, line)
    message = str(err.value)
    assert says in message and never not in message, message
    assert _state(ip) == before and extension.state().ctl.runs() == []


def test_a_flag_of_one_subcommand_still_names_that_subcommand_only(ip):
    """A flag some %pathways subcommand takes is not sent to the cell magic instead."""
    with pytest.raises(UsageError, match=re.escape(
            "--priority goes with %pathways client, not with %pathways slice.")):
        run(ip, "%pathways slice s1 2 --priority 3")
