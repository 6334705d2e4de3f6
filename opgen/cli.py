"""`opgen` command line.

Subcommands live in one table, COMMANDS; adding one (tune, db, bench, ...) is

    def _tune_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("spec")

    @command("tune", "search kernel configurations for a spec", _tune_args)
    def cmd_tune(args: argparse.Namespace) -> int:
        ...
        return 0

in this module, or `register(Command(...))` from another module imported
below the table.  A command returns the exit status.  Errors: `SpecErrors`
print one `FILE:LINE: field: message` line each to stderr; `UserError` prints
`opgen: error: ...`; both exit 2 without a traceback.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from opgen.codegen.errors import SpecErrors, UserError

ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90")
DEFAULT_ARCH = "sm_90"
EXIT_USAGE = 2


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: Dict[str, Command] = {}


def register(cmd: Command) -> Command:
    if cmd.name in COMMANDS:
        raise ValueError(f"opgen subcommand {cmd.name!r} registered twice")
    COMMANDS[cmd.name] = cmd
    return cmd


def command(name: str, help: str,
            configure: Optional[Callable[[argparse.ArgumentParser], None]] = None):
    """Decorator: register the function as subcommand `name`."""
    def deco(fn: Callable[[argparse.Namespace], int]):
        register(Command(name, help, configure or (lambda p: None), fn))
        return fn
    return deco


# --- helpers --------------------------------------------------------------------

def load(arg: str):
    """Spec argument (file path or shipped name) -> validated Spec."""
    from opgen.codegen.validate import load_spec, resolve_spec
    path = resolve_spec(arg)
    # errors name the file as the user wrote it; a shipped spec by its path
    return load_spec(path, filename=arg if Path(arg).is_file() else str(path))


def positive_int(text: str) -> int:
    try:
        v = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return v


# --- check ----------------------------------------------------------------------

def _check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="+", metavar="SPEC",
                   help="spec file (.yaml) or shipped spec name")


@command("check", "validate spec files", _check_args)
def cmd_check(args: argparse.Namespace) -> int:
    errors: List = []
    for arg in args.spec:
        try:
            spec = load(arg)
        except SpecErrors as e:
            errors.extend(e.errors)
            continue
        print(f"{arg}: ok ({spec.name})")
    if errors:
        raise SpecErrors(errors)
    return 0


# --- list -----------------------------------------------------------------------

@command("list", "list the shipped specs")
def cmd_list(args: argparse.Namespace) -> int:
    from opgen.codegen.validate import load_spec, shipped_specs
    specs = shipped_specs()
    width = max((len(n) for n in specs), default=0)
    for name, path in specs.items():
        try:
            desc = load_spec(path).description
        except SpecErrors as e:  # a broken shipped spec is a bug; say so, go on
            desc = f"(invalid: {e.errors[0]})"
        print(f"{name:<{width}}  {desc}".rstrip())
    return 0


# --- build ----------------------------------------------------------------------

def _build_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="spec file (.yaml) or shipped spec name")
    p.add_argument("-o", "--out", dest="out_dir", default=None, metavar="DIR",
                   help="output directory (default: build/<spec name>)")
    p.add_argument("--arch", choices=ARCHES, default=DEFAULT_ARCH,
                   help=f"target GPU architecture (default {DEFAULT_ARCH})")
    for dim in ("M", "N", "K"):
        p.add_argument(f"--{dim}", type=positive_int, default=None, metavar=dim,
                       help=f"fix {dim} (must agree with the spec's shape)")


@command("build", "generate CUDA sources for a spec", _build_args)
def cmd_build(args: argparse.Namespace) -> int:
    from opgen.codegen.validate import specialize_shape
    spec = load(args.spec)
    shape = specialize_shape(spec, M=args.M, N=args.N, K=args.K)
    out_dir = Path(args.out_dir) if args.out_dir else Path("build") / spec.name
    from opgen.codegen.build import build_spec
    result = build_spec(spec, out_dir, args.arch, M=shape.M, N=shape.N, K=shape.K)
    for p in _paths(result):
        print(p)
    return 0


def _paths(result) -> List[str]:
    if result is None:
        return []
    if isinstance(result, (str, Path)):
        return [str(result)]
    if isinstance(result, dict):
        return [str(v) for v in result.values()]
    return [str(p) for p in result]


# --- bench (opgen/bench/; imports torch/cupy only when it runs) -----------------------

def _bench_args(p: argparse.ArgumentParser) -> None:
    from opgen import bench
    bench.add_arguments(p)


@command("bench", "time opgen's kernels against cuBLAS/torch peers on this GPU "
                  "(JSON, Markdown, plots)", _bench_args)
def cmd_bench(args: argparse.Namespace) -> int:
    from opgen import bench
    return bench.run(args)


# --- entry point ------------------------------------------------------------------

def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opgen",
        description="Compile declarative YAML specs of quantized matmuls into CUDA kernels.")
    from opgen import __version__
    parser.add_argument("--version", action="version", version=f"opgen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for cmd in COMMANDS.values():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.configure(p)
        p.set_defaults(_run=cmd.run)
    # tune and db live with the tuner and its database; they set args.func.
    from opgen.runtime import tuner, tuning_db
    tuner.add_cli(sub)
    tuning_db.add_cli(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)          # usage errors: argparse exits 2
    try:
        run = getattr(args, "_run", None) or args.func
        rc = run(args)
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
