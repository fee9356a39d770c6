"""Names that carry meaning are spelled once: the runtime's enums. The notebook's magics, the
sidebar's comm schema and the TypeScript protocol (extension/src/protocol.ts) must offer exactly
the runtime's policies and dispatch modes, in the same order."""

from __future__ import annotations

import argparse
import re

import pytest

from pwkernel.notebook import args, comm
from pwkernel.runtime.dispatcher import DispatchMode
from pwkernel.runtime.scheduler import Policy
from tests.helpers import ROOT

PROTOCOL_TS = ROOT / "extension" / "src" / "protocol.ts"
POLICIES = [p.value for p in Policy]
MODES = [m.value for m in DispatchMode]


def ts_names(source: str, const: str) -> list[str]:
    """The strings of ``export const NAME = [...] as const;`` in TypeScript ``source``."""
    found = re.search(rf"export const {const}\s*=\s*\[([^\]]*)\]", source)
    assert found, f"no `export const {const} = [...]` in {PROTOCOL_TS.name}"
    return [a or b for a, b in re.findall(r"'([^']*)'|\"([^\"]*)\"", found.group(1))]


def test_the_comm_schema_offers_the_runtimes_names():
    assert list(comm.POLICIES) == POLICIES and list(comm.DISPATCH) == MODES


@pytest.mark.parametrize(("const", "expected"), [("POLICIES", POLICIES),
                                                 ("DISPATCH_MODES", MODES)])
def test_the_typescript_protocol_offers_the_runtimes_names(const, expected):
    assert ts_names(PROTOCOL_TS.read_text(), const) == expected, (
        f"extension/src/protocol.ts's {const} differs from the runtime's enum; edit it and "
        "rebuild the extension (extension/setup.sh)")


def test_the_magics_offer_the_runtimes_names():
    commands = next(a for a in args.LINE._actions if isinstance(a, argparse._SubParsersAction))
    choices = {a.dest: list(a.choices) for name in ("policy", "dispatch")
               for a in commands.choices[name]._actions if a.choices}
    assert choices == {"policy": POLICIES, "mode": MODES}


def test_a_drifted_name_is_caught():
    drifted = PROTOCOL_TS.read_text().replace("'share'", "'fair'")
    assert ts_names(drifted, "POLICIES") != POLICIES
