"""The argument specs of ``%pathways`` and ``%%pathways``: one parser per command.

The magics and their help (``%pathways?``, ``%%pathways?``) both come from these parsers, so
the documentation cannot drift from what is accepted. Parsers raise ``UsageError`` (a short
message in the notebook, no traceback) instead of exiting the kernel.
"""

from __future__ import annotations

import argparse
import difflib
import keyword
import math
import re

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser
from IPython.utils.process import arg_split

from ..runtime.device_groups import ROW_MODES
from ..runtime.dispatcher import DispatchMode
from ..runtime.scheduler import Policy


class _Parser(MagicArgumentParser):
    """A MagicArgumentParser whose errors name the command and point at its help."""

    def __init__(self, *args, hint: str = "%pathways?", label: str = "%pathways", **kwargs):
        kwargs.setdefault("add_help", False)
        super().__init__(*args, **kwargs)
        self.allow_abbrev = False  # (--axis is no --axis-types, but a typo of --axes)
        self.hint, self.label = hint, label
        self.subcommands: dict[str, argparse.ArgumentParser] = {}  # name -> its parser
        self.conflict_fix = ""  # what to do when flags that exclude each other meet
        self.elsewhere: dict[str, _Parser] = {}  # the other magic's parsers, by their line

    def add_subparsers(self, **kwargs):
        # argparse keeps its subparsers only in private fields: remember them here
        action = super().add_subparsers(**kwargs)
        self.subcommands = action.choices
        return action

    def error(self, message: str, command: str | None = None):
        """``command``: the subcommand the arguments were given to (its flags are the ones a
        misspelt flag is compared with); None: any subcommand's. A missing argument is shown
        with the usage of the (sub)command it belongs to, which lists the choices."""
        usage = ""
        if message.startswith("the following arguments are required"):
            usage = " Usage: " + " ".join(self.format_usage().replace("::", "").split()) + "."
        elif " not allowed with argument " in message:
            usage = " " + self.conflict_fix if self.conflict_fix else ""
        raise UsageError(f"{self.label}: {message}.{self._did_you_mean(message, command)}"
                         f"{usage} See {self.hint} for the accepted arguments.")

    def flags(self) -> list[str]:
        """Every option string this parser takes (``--timeout``, ...)."""
        return [f for action in self._actions for f in action.option_strings]

    def option_help(self) -> dict[str, str | None]:
        """Each option (by its first flag) and its help, None where it has none."""
        return {a.option_strings[0]: a.help for a in self._actions if a.option_strings}

    def _did_you_mean(self, message: str, command: str | None = None) -> str:
        """For unrecognized flags: a flag of another subcommand says whose it is; any other,
        the flags of this command it looks like."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        subs = {n: p for n, p in self.subcommands.items() if isinstance(p, _Parser)}
        own = self.flags() + (subs[command].flags() if command in subs else
                              [f for p in subs.values() for f in p.flags()])
        notes, near = [], set()
        for word in message.split(":", 1)[1].split():
            flag = word.split("=")[0]
            if not flag.startswith("-"):
                continue
            whose = [f"{self.label} {n}" for n, p in subs.items() if flag in p.flags()] or [
                label for label, p in self.elsewhere.items() if flag in p.flags()]
            if flag not in own and whose:
                here = self.label if command is None else f"{self.label} {command}"
                notes.append(f" {flag} goes with {' and '.join(whose)}, not with {here}.")
            else:
                near.update(difflib.get_close_matches(flag, own, n=1))
        near -= set(message.split())  # (a flag given exactly is no typo of itself)
        return "".join(notes) + (f" Did you mean {', '.join(sorted(near))}?" if near else "")


_DIMS = re.compile(r"[1-9][0-9]*(?:[xX*][1-9][0-9]*)*|[1-9][0-9]*(?:,[1-9][0-9]*)*")


def _dims(text: str, what: str, example: str) -> tuple[int, ...]:
    """``"2"`` -> (2,); ``"2x2"``, ``"2*2"`` or ``"2,2"`` -> (2, 2): positive ints, one separator
    between each two, nothing else."""
    text = text.strip()
    if not _DIMS.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{what} {text[:40]!r} is not a list of positive ints; expected {example}")
    return tuple(int(p) for p in re.split(r"[xX*,]", text))


def _shape(text: str) -> tuple[int, ...]:
    return _dims(text, "slice shape", "e.g. 2, 2x2 or 2,2")


def _ids(text: str) -> tuple[int, ...]:
    """``"4,5"`` -> (4, 5): device ids (ints from 0), comma-separated."""
    if not re.fullmatch(r"[0-9]+(?:,[0-9]+)*", text.strip()):
        raise argparse.ArgumentTypeError(
            f"device ids {text[:40]!r} are not comma-separated ints; expected e.g. "
            "--devices 4,5 (the ids %pathways status lists)")
    return tuple(int(p) for p in text.split(","))


def _axes(text: str) -> tuple[str, ...]:
    names = tuple(a.strip() for a in text.split(",") if a.strip())
    if not names or not all(n.isidentifier() for n in names):
        raise argparse.ArgumentTypeError(
            f"axis names {text!r} must be comma-separated identifiers, e.g. --axes data,model")
    return names


def _axis_types(text: str) -> tuple[str, ...]:
    types = tuple(t.strip().lower() for t in text.split(",") if t.strip())
    if not types or not set(types) <= {"explicit", "auto"}:
        raise argparse.ArgumentTypeError(
            f"axis types {text!r} must be explicit or auto, for all axes or comma-separated "
            "per axis, e.g. --axis-types explicit or --axis-types explicit,auto")
    return types


def _name(text: str) -> str:
    if not text.isidentifier() or keyword.iskeyword(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a name a variable can have; pick one such as s0")
    return text


def _number(text: str, low: float, high: float, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not low < value <= high:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"expected {what}, got {text[:40]!r}")
    return value


MAX_TIMEOUT = 365 * 24 * 3600.0  # a year: longer waits are no --timeout at all


def _weight(text: str) -> float:
    return _number(text, 0.0, 1e6, "a positive number up to 1e6, e.g. 2")


def _seconds(text: str) -> float:
    return _number(text, 0.0, MAX_TIMEOUT, f"a positive number of seconds up to "
                   f"{MAX_TIMEOUT:.0f} (a year); leave --timeout out to wait without a limit")


def _client(text: str) -> str:
    if not text.strip() or len(text) > 100:
        raise argparse.ArgumentTypeError(
            f"a client name is 1 to 100 characters, not all blank; got {text[:40]!r}. Maybe "
            "you want a name such as alice")
    return text


def _pool(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", text):
        raise argparse.ArgumentTypeError(
            f"pool name {text[:40]!r} is not 1 to 64 letters, digits, '-', '_' or '.' starting "
            "with a letter or digit; e.g. --pool class")
    return text


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive device count, got {text[:40]!r}")
    return value


def _sizes(text: str) -> tuple[int, ...]:
    return _dims(text, "devices per island", "e.g. 4,4")


def line_parser() -> _Parser:
    """``%pathways SUBCOMMAND ...``."""
    p = _Parser(prog="pathways", description="Inspect and steer the Pathways controller.")
    sub = p.add_subparsers(dest="command", metavar="SUBCOMMAND", parser_class=_Parser)
    sub.required = False
    sub.add_parser("status", help="islands, devices, slices, programs and memory per device")
    s = sub.add_parser("slice", help="bind a VirtualSlice to NAME, e.g. %%pathways slice s0 2x2")
    s.add_argument("name", type=_name, metavar="NAME")
    s.add_argument("shape", type=_shape, metavar="SHAPE", help="2, 2x2 or 2,2")
    s.add_argument("--island", type=int, default=None, metavar="I",
                   help="the island to take it on (default: the least loaded)")
    s.add_argument("--devices", type=_ids, default=None, metavar="4,5",
                   help="the device ids to place it on, one per device of SHAPE, in mesh order "
                        "(as ctl.slice(..., devices=[4, 5]); default: the least loaded)")
    s.add_argument("--axes", type=_axes, default=None, metavar="x,y",
                   help="a name for each dimension of SHAPE (default: x, y, z, w)")
    s.add_argument("--axis-types", dest="axis_types", type=_axis_types, default=None,
                   metavar="explicit|auto",
                   help="JAX mesh axis types (default: what jax.make_mesh gives, explicit)")
    r = sub.add_parser("release", help="give slice NAME back and remove the name")
    r.add_argument("name", type=_name, metavar="NAME")
    pol = sub.add_parser("policy", help="the gang scheduling policy of every island")
    pol.add_argument("policy", choices=[p.value for p in Policy])
    d = sub.add_parser("dispatch", help="parallel (Pathways) or sequential (baseline) dispatch")
    d.add_argument("mode", choices=[m.value for m in DispatchMode])
    c = sub.add_parser("client", help="the client later cells submit as")
    c.add_argument("name", type=_client, metavar="NAME")
    c.add_argument("--weight", type=_weight, default=1.0, metavar="W",
                   help="its share under policy 'share' (above 0, up to 1e6; default 1)")
    c.add_argument("--priority", type=int, default=0, metavar="P",
                   help="its rank under policy 'priority' (higher first; default 0)")
    t = sub.add_parser("trace", help="trace save PATH [--rows auto|device|host|island] "
                                     "(Perfetto JSON) | trace clear")
    t.add_argument("action", choices=["save", "clear"])
    t.add_argument("path", nargs="?", default=None, metavar="PATH")
    t.add_argument("--rows", choices=ROW_MODES, default=None, metavar="|".join(ROW_MODES),
                   help="save: a track per device, host or island; auto (the default) keeps "
                        "one per device up to 64 devices, then groups them")
    sub.add_parser("reset", help="cancel every queued computation and release magic slices")
    at = sub.add_parser("attach", help="host the islands elsewhere, e.g. %%pathways attach ray "
                                       "--address auto --islands 4,4, join a device pool: "
                                       "%%pathways attach ray --address A --pool NAME, or "
                                       "simulate them: "
                                       "%%pathways attach sim --preset tpu-v4 --islands 2048")
    at.add_argument("backend", choices=["ray", "local", "sim"])
    at.add_argument("--address", default=None, metavar="A",
                    help="a running Ray cluster ('auto' or host:port); default: a local one")
    at.add_argument("--pool", type=_pool, default=None, metavar="NAME",
                    help="ray: attach to device pool NAME at --address as one of its tenants "
                         "(python -m pwkernel.pool start --name NAME; docs/pool.md)")
    at.add_argument("--tenant", type=_client, default=None, metavar="NAME",
                    help="ray --pool: this kernel's name among the pool's tenants (default: "
                         "PWKERNEL_TENANT, else host:pid)")
    at.add_argument("--weight", type=_weight, default=None, metavar="W",
                    help="ray --pool: this kernel's share of the pool's islands (default 1)")
    at.add_argument("--islands", type=_sizes, default=None, metavar="4,4",
                    help="devices per island (sim: chips per island); default: the "
                         "islands in use now (sim: the preset's machine; --pool: the pool's)")
    at.add_argument("--preset", default=None, metavar="NAME",
                    help="sim: the simulated machine (tpu-v3, tpu-v4, a100, h100, h200, "
                         "this-machine; default tpu-v4); --islands then counts its chips")
    return p


def cell_parser() -> _Parser:
    """``%%pathways [options]`` on top of a cell."""
    p = _Parser(prog="%pathways", hint="%%pathways?", label="%%pathways",
                description="Run the cell as ONE Pathways program on a slice.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--slice", type=_name, default=None, metavar="NAME",
                       help="run on the VirtualSlice bound to NAME")
    where.add_argument("--devices", type=_count, default=None, metavar="N",
                       help="run on a fresh slice of N devices (released when the cell's "
                            "program ends)")
    p.conflict_fix = ("--slice and --devices exclude each other: --slice NAME runs the cell "
                      "on the slice made with %pathways slice NAME SHAPE, --devices N on a "
                      "fresh slice of N devices. Keep one of them.")
    p.add_argument("--island", type=int, default=None, metavar="I",
                   help="the island of --devices (default: the least loaded)")
    p.add_argument("--client", type=_client, default=None, metavar="NAME",
                   help="submit as client NAME")
    p.add_argument("--weight", type=_weight, default=None, metavar="W",
                   help="the client's share under policy 'share'")
    p.add_argument("--priority", type=int, default=None, metavar="P",
                   help="the client's rank under policy 'priority' (higher first)")
    p.add_argument("--sequential", action="store_true",
                   help="dispatch this cell sequentially (the paper's baseline)")
    p.add_argument("--no-block", dest="no_block", action="store_true",
                   help="return at once; the cell's names hold futures")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="S",
                   help="cancel the cell's program after S seconds (with --no-block too)")
    p.add_argument("--viz", action="store_true", help="show what ran where, and how long")
    return p


LINE = line_parser()
CELL = cell_parser()
# (a flag of the other magic says whose it is: %%pathways --axes x, %pathways ... --timeout 3)
LINE.elsewhere = {"%%pathways (the cell magic)": CELL}
CELL.elsewhere = {f"%pathways {name}": sub for name, sub in LINE.subcommands.items()
                  if isinstance(sub, _Parser)}


def _without_comment(line: str) -> str:
    """``line`` up to a ``#`` that starts a word outside quotes, as a shell reads a comment
    (``slice s0 2  # data``); a ``#`` inside a word or in quotes (``t#1.json``) stays."""
    quote, escaped = None, False
    for i, ch in enumerate(line):
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote is not None:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _split(line: str, prog: str) -> list[str]:
    try:
        words = arg_split(_without_comment(line), posix=True)
    except ValueError as e:  # unbalanced quotes
        raise UsageError(f"{prog}: cannot split {line!r} into arguments ({e}).") from None
    asked = [w for w in words if w in ("-h", "--help")]
    if asked:  # (the parsers have no -h: the magic's docstring is its help)
        raise UsageError(f"{prog} takes no {asked[0]}: its help is {prog}? (IPython's help, "
                         f"on a line of its own), which lists every flag.")
    return words


def parse_line(line: str) -> argparse.Namespace:
    """Parse ``%pathways`` arguments; no subcommand means ``status``."""
    args, rest = LINE.parse_known_args(_split(line, "%pathways"))
    if (args.command == "trace" and args.path is None and len(rest) == 1
            and not rest[0].startswith("-")):
        # argparse (before 3.12) fills an optional positional before the flags that come
        # first: ``trace save --rows host t.json`` leaves PATH over; it is the PATH
        args.path, rest = rest[0], []
    if rest:
        LINE.error(f"unrecognized arguments: {' '.join(rest)}", args.command or "status")
    if args.command is None:
        args.command = "status"
    if args.command == "trace":
        _check_trace_flags(args)
    if args.command == "slice":
        _check_slice_flags(args)
    return args


def _check_trace_flags(a: argparse.Namespace) -> None:
    """``trace save`` needs a PATH; ``trace clear`` takes neither a PATH nor ``--rows``."""
    if a.action == "save" and not a.path:
        raise UsageError("%pathways trace save needs a PATH, e.g. %pathways trace save run.json")
    if a.action == "clear" and (a.path is not None or a.rows is not None):
        given = " ".join(x for x in (a.path, a.rows and f"--rows {a.rows}") if x)
        raise UsageError(f"%pathways trace clear takes no arguments, got {given[:60]!r}. Maybe "
                         "you want %pathways trace save PATH (which takes --rows), or "
                         "%pathways trace clear alone.")


def _check_slice_flags(a: argparse.Namespace) -> None:
    """``--devices`` lists one distinct id per device of SHAPE; ``--axes`` names each
    dimension of SHAPE once; ``--axis-types`` gives one type, or one
    per dimension. The error shows the flags as the magic takes them."""
    dims, shape = len(a.shape), "x".join(map(str, a.shape))
    usage = f"%pathways slice {a.name} {shape}"
    size = math.prod(a.shape)
    if a.devices is not None and (len(a.devices) != size or len(set(a.devices)) != size):
        raise UsageError(
            f"%pathways slice {a.name}: --devices {','.join(map(str, a.devices))} must list "
            f"{size} distinct device ids for shape {shape}, one per device, in mesh order. "
            f"Maybe you want {usage} --devices {','.join(map(str, range(size)))}.")
    if a.axes is not None and (len(a.axes) != dims or len(set(a.axes)) != dims):
        names = ("x", "y", "z", "w")[:dims] if dims <= 4 else [f"a{i}" for i in range(dims)]
        raise UsageError(
            f"%pathways slice {a.name}: --axes {','.join(a.axes)} must name each of the {dims} "
            f"dimensions of shape {shape} once. Maybe you want {usage} --axes {','.join(names)}.")
    if a.axis_types is not None and len(a.axis_types) not in (1, dims):
        raise UsageError(
            f"%pathways slice {a.name}: --axis-types {','.join(a.axis_types)} gives "
            f"{len(a.axis_types)} types for the {dims} dimensions of shape {shape}: give one "
            f"for all, or one each. Maybe you want {usage} --axis-types {a.axis_types[0]}.")


def parse_cell(line: str) -> argparse.Namespace:
    """Parse the ``%%pathways`` line; ``--island`` only goes with ``--devices``."""
    args = CELL.parse_args(_split(line, "%%pathways"))
    if args.island is not None and args.devices is None:
        if args.slice is not None:
            raise UsageError(f"%%pathways: --island I chooses where --devices N are taken; "
                             f"--slice {args.slice} already fixes its island. Drop --island.")
        raise UsageError(f"%%pathways: --island I chooses where --devices N are taken; without "
                         f"--devices the cell runs on all devices of island 0. Add --devices N "
                         f"(e.g. %%pathways --devices 2 --island {args.island}), or drop "
                         f"--island.")
    return args


def help_text(parser: _Parser) -> str:
    """The help of a parser and its subcommands, for the magics' docstrings."""
    text = parser.format_help()
    for name, sub in parser.subcommands.items():
        usage = sub.format_usage().replace("usage: ", "").strip()
        text += f"\n{name}:\n  {usage}\n"
        # then what its arguments mean, where the parser says (a list of bare names, none)
        for section in sub.format_help().split("\n\n")[2:]:
            lines = section.rstrip("\n").splitlines()
            if any(len(line.split()) > 1 for line in lines[1:]):
                text += "".join(f"  {line}\n" for line in lines)
    return text


def as_cell_flags(message: str) -> str:
    """A runtime error's ``ctl.slice(4)`` / ``ctl.slice(4, island=1)`` written as the
    ``%%pathways`` flags that do the same (``%%pathways --devices 4 --island 1``)."""
    return re.sub(r"\bctl\.slice\(([0-9]+)(?:, island=([0-9]+))?\)",
                  lambda m: f"%%pathways --devices {m.group(1)}"
                  + (f" --island {m.group(2)}" if m.group(2) else ""), message)


def as_flags(message: str, name: str = "NAME") -> str:
    """A runtime error's ``ctl.slice`` keywords (``devices=[4, 5]``, ``island=1``) written as
    the ``%pathways slice`` flags that do the same (``--devices 4,5``, ``--island 1``), and its
    ``ctl.slice(4)`` as the line that does the same (``%pathways slice NAME 4``)."""
    message = re.sub(r"\bctl\.slice\(([0-9]+)(, island=[0-9]+)?\)",
                     lambda m: f"%pathways slice {name} {m.group(1)}{m.group(2) or ''}", message)
    message = re.sub(r"\bdevices=\[([0-9, ]*)\]",
                     lambda m: "--devices " + m.group(1).replace(" ", ""), message)
    return re.sub(r",? \bisland=([0-9]+)", r" --island \1", message)
