"""`opgen check SPEC...` (validate spec files), `opgen list` (the shipped
specs) and `opgen schema` (the spec language as JSON Schema, for editors)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List

from ..codegen.errors import SpecErrors, UserError
from ..codegen.resolve import as_spec, load_spec, shipped_specs
from ..codegen.schema import schema_text, shipped_schema
from .command import Command


def _check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="+", metavar="SPEC",
                   help="spec file (.yaml) or shipped spec name")


def cmd_check(args: argparse.Namespace) -> int:
    errors: List = []
    for arg in args.spec:
        try:
            spec = as_spec(arg)
        except SpecErrors as e:
            errors.extend(e.errors)
            continue
        print(f"{arg}: ok ({spec.name})")
    if errors:
        raise SpecErrors(errors)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    specs = shipped_specs()
    width = max((len(n) for n in specs), default=0)
    for name, path in specs.items():
        try:
            desc = load_spec(path).description
        except SpecErrors as e:  # a broken shipped spec is a bug; say so, go on
            desc = f"(invalid: {e.errors[0]})"
        print(f"{name:<{width}}  {desc}".rstrip())
    return 0


def _schema_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--out", dest="out_file", default=None, metavar="FILE",
                   help=f"write it to FILE (default: print it; the package ships it as "
                        f"{shipped_schema().name} next to the shipped specs)")


def cmd_schema(args: argparse.Namespace) -> int:
    text = schema_text()
    if args.out_file is None:
        sys.stdout.write(text)
        return 0
    try:
        Path(args.out_file).write_text(text)
    except OSError as e:
        raise UserError(f"cannot write {args.out_file}: {e.strerror or e}") from None
    print(args.out_file)
    return 0


COMMANDS = (Command("check", "validate spec files", _check_args, cmd_check),
            Command("list", "list the shipped specs", lambda p: None, cmd_list),
            Command("schema", "print the JSON Schema of spec files (for editors)", _schema_args,
                    cmd_schema))
