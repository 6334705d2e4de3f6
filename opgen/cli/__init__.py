"""`opgen` command line: one module per subcommand group, each listing its
Commands (command.py); COMMANDS below is the table `opgen` is built from.
Adding a subcommand is a Command(name, help, configure(parser), run(args))
in one of them (or a new module added to the table).  A command returns the
exit status.  Errors: `SpecErrors` print one `FILE:LINE: field: message`
line each to stderr; `UserError` prints `opgen: error: ...`; both exit 2
without a traceback. Warnings print as one `opgen: warning: ...` line.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from typing import Dict, Optional, Sequence

from .. import __version__
from ..codegen.errors import SpecErrors, UserError
from . import bench, build, db, specs, tune
from .command import Command

EXIT_USAGE = 2

COMMANDS: Dict[str, Command] = {
    c.name: c for c in (*specs.COMMANDS, *build.COMMANDS, *tune.COMMANDS, *db.COMMANDS,
                        *bench.COMMANDS)}


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opgen",
        description="Compile declarative YAML specs of quantized matmuls into CUDA kernels.")
    parser.add_argument("--version", action="version", version=f"opgen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for cmd in COMMANDS.values():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.configure(p)
        p.set_defaults(_run=cmd.run)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line, `opgen: warning: ...` (no source line: it is
    meant for the user, not for the code's author)."""
    text = str(message)
    text = text[len("opgen: "):] if text.startswith("opgen: ") else text
    print(f"opgen: warning: {text}", file=sys.stderr if file is None else file)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)          # usage errors: argparse exits 2
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            rc = args._run(args)
    except SpecErrors as e:
        sys.stdout.flush()
        for err in e.errors:
            print(err, file=sys.stderr)
        return EXIT_USAGE
    except UserError as e:
        sys.stdout.flush()
        print(f"opgen: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # e.g. `opgen list | head`
        return 0
    except (RuntimeError, OSError) as e:   # CompileError, missing CUDA, unreadable file
        sys.stdout.flush()
        print(f"opgen: error: {e}", file=sys.stderr)
        return 1
    return 0 if rc is None else int(rc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
