"""`opgen check SPEC...` (validate spec files) and `opgen list` (the shipped specs)."""
from __future__ import annotations

import argparse
from typing import List

from ..codegen.errors import SpecErrors
from ..codegen.resolve import as_spec, load_spec, shipped_specs
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


COMMANDS = (Command("check", "validate spec files", _check_args, cmd_check),
            Command("list", "list the shipped specs", lambda p: None, cmd_list))
