"""`opgen bench` (also `python -m opgen.bench`): its options, and the run
(opgen/bench/entry.py) they start."""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import List, Optional, Sequence

from ..bench import e2e, e2e_model, entry
from ..bench.e2e_variants import DEFAULT_VARIANTS, variant
from ..bench.plan import (BASELINE, DEFAULT_BUDGET_MS, DEFAULT_MEM_CAP_GB, DEFAULT_MS,
                          DEFAULT_SHAPES, PEERS, QUICK_MS, QUICK_SHAPES, QUICK_SPECS)
from ..codegen.errors import SpecErrors, UserError
from ..model_shapes import shipped_models
from ..runtime.device import has_gpu
from .args import parse_ints, parse_names, parse_shapes, positive_int
from .command import Command

HELP = "time opgen's kernels against cuBLAS/torch peers on this GPU (JSON, Markdown, plots)"


def _peer_names(text: str) -> List[str]:
    names = parse_names(text)
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown peer(s) {', '.join(bad)} (known: {', '.join(PEERS)})")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `opgen bench` / `python -m opgen.bench`."""
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory for bench.json, bench.md and the plots (required: "
                        "a run writes nowhere it is not told to)")
    p.add_argument("--quick", action="store_true",
                   help=f"{'/'.join(f'{n}x{k}' for n, k in QUICK_SHAPES)}, M in "
                        f"{','.join(map(str, QUICK_MS))}, {len(QUICK_SPECS)} specs "
                        "(--specs/--shapes/--Ms still override)")
    p.add_argument("--specs", type=parse_names, default=None, metavar="A,B",
                   help="specs (shipped names or YAML files; default: every shipped matmul spec)")
    p.add_argument("--shapes", type=parse_shapes, default=None, metavar="NxK,...",
                   help="weight shapes N x K (default: "
                        + ",".join(f"{n}x{k}" for n, k in DEFAULT_SHAPES) + ")")
    p.add_argument("--Ms", type=parse_ints, default=None, metavar="M,...",
                   help="token counts (default: " + ",".join(map(str, DEFAULT_MS)) + ")")
    p.add_argument("--peers", type=_peer_names, default=None, metavar="A,B",
                   help="peers to time (default: all of " + ",".join(PEERS) + "; "
                        f"{BASELINE} is always timed)")
    p.add_argument("--budget-ms", type=float, default=DEFAULT_BUDGET_MS,
                   help=f"device time per measurement (default {DEFAULT_BUDGET_MS:g})")
    p.add_argument("--db", default=None, metavar="PATH",
                   help="tuning DB (default: $OPGEN_TUNING_DB or ~/.cache/opgen/tuning.json)")
    p.add_argument("--no-db", action="store_true", help="ignore the tuning DB: heuristic configs only")
    p.add_argument("--no-verify", action="store_true",
                   help="skip checking opgen's output rows against the numpy reference")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    p.add_argument("--no-graph", action="store_true",
                   help="skip graph mode (L layers back to back in one CUDA graph, rows with M <= 16)")
    p.add_argument("--no-pdl", action="store_true",
                   help="skip graph mode's PDL variant (the same layers with kernels built for "
                        "programmatic dependent launch; sm_90+)")
    p.add_argument("--workers", type=int, default=None,
                   help="compile processes (default: all cores but one)")
    p.add_argument("--mem-cap-gb", type=float, default=DEFAULT_MEM_CAP_GB,
                   help="memory for the rotating input copies of one problem")
    p.add_argument("--seed", type=int, default=0)
    e = p.add_argument_group(
        "end-to-end decode (--e2e)",
        "a transformers model built from its config with random weights, decoded greedily "
        "(static KV cache, CUDA graph) with each variant's linear layers -> e2e.json, e2e.md, "
        "e2e.png")
    e.add_argument("--e2e", action="store_true", help="time whole-model decoding instead of kernels")
    e.add_argument("--model", default=None, metavar="NAME|PATH",
                   help=f"a shipped model ({', '.join(shipped_models())}) or a "
                        f"config.json / model directory (default {e2e.DEFAULT_MODEL})")
    e.add_argument("--layers", type=positive_int, default=None,
                   help="decoder layers (default: the config's num_hidden_layers)")
    e.add_argument("--batches", type=parse_ints, default=None, metavar="B,...",
                   help="batch sizes (default " + ",".join(map(str, e2e.DEFAULT_BATCHES)) + ")")
    e.add_argument("--prompt", type=positive_int, default=None,
                   help=f"prompt tokens (default {e2e.DEFAULT_PROMPT})")
    e.add_argument("--new-tokens", type=positive_int, default=None,
                   help=f"tokens generated per prompt (default {e2e.DEFAULT_NEW_TOKENS})")
    e.add_argument("--variants", type=parse_names, default=None, metavar="A,B",
                   help="fp16, no_linear, opgen:SPEC (options +pdl, +fuse), torch_int4, gemlite_w4 (default: "
                        + ",".join(DEFAULT_VARIANTS) + ")")
    e.add_argument("--repeats", type=positive_int, default=None,
                   help=f"timed runs per row, the median reported (default {e2e.DEFAULT_REPEATS})")
    e.add_argument("--no-accuracy", action="store_true",
                   help="skip the logits and token-agreement runs")
    e.add_argument("--no-compile", action="store_true",
                   help="the decode step as transformers runs it eagerly (captured as it is), "
                        "instead of through torch.compile (Inductor, whole graph: transformers' "
                        "norm, rotary and attention kernels fused, as static-cache serving runs "
                        "it; one compile per variant and batch)")
    e.add_argument("--load-time", action="store_true",
                   help="also write the model as a GPTQ checkpoint and time a fresh process "
                        "loading it to a model ready to decode")
    p.set_defaults(entry="opgen bench")


def command_line(args: argparse.Namespace) -> str:
    """The command as typed (for bench.json)."""
    name = getattr(args, "entry", "opgen bench")
    rest = sys.argv[1:]
    if name == "opgen bench" and rest[:1] == ["bench"]:
        rest = rest[1:]
    return " ".join([name, shlex.join(rest)]).strip()


KERNEL_ONLY = ("quick", "specs", "shapes", "Ms", "peers", "no_db", "db", "no_verify", "no_graph",
               "no_pdl")
E2E_ONLY = ("model", "layers", "batches", "prompt", "new_tokens", "variants", "repeats", "no_accuracy",
            "no_compile", "load_time")


def _given(args: argparse.Namespace, names) -> List[str]:
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n, None) not in (None, False)]


def e2e_plan(args: argparse.Namespace) -> e2e.Plan:
    """The --e2e run's plan from the options (UserError names a bad one)."""
    stray = _given(args, KERNEL_ONLY)
    if stray:
        raise UserError(f"{', '.join(stray)}: kernel-bench options; --e2e takes "
                        + ", ".join("--" + n.replace("_", "-") for n in E2E_ONLY))
    name = args.model or e2e.DEFAULT_MODEL
    config, source = e2e_model.model_config(name, args.layers)
    variants = args.variants or list(DEFAULT_VARIANTS)
    for v in variants:
        try:
            variant(v)
        except ValueError as err:
            raise UserError(f"--variants: {err}") from None
    return e2e.Plan(model=name, config=config, source=source,
                    batches=args.batches or e2e.DEFAULT_BATCHES,
                    prompt=args.prompt or e2e.DEFAULT_PROMPT,
                    new_tokens=args.new_tokens or e2e.DEFAULT_NEW_TOKENS, variants=variants,
                    repeats=args.repeats or e2e.DEFAULT_REPEATS, accuracy=not args.no_accuracy,
                    compile=not args.no_compile, load_time=args.load_time, seed=args.seed)


def cmd_bench(args: argparse.Namespace) -> int:
    if getattr(args, "e2e", False):
        plan = e2e_plan(args)
        if not has_gpu():
            # (e2e.main runs on a CPU too, for its tests' tiny models; an LLM's
            # layers there run the numpy reference for hours, timing nothing useful)
            raise UserError("opgen bench --e2e needs a CUDA GPU (no CUDA device through CuPy here)")
        return e2e.main(plan, args.out, command_line(args), args.workers, plots=not args.no_plots)
    stray = _given(args, E2E_ONLY)
    if stray:
        raise UserError(f"{', '.join(stray)}: options of --e2e (add --e2e, or leave them out)")
    return entry.run(args, command_line(args))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m opgen.bench [options]` (the same as `opgen bench`)."""
    p = argparse.ArgumentParser(prog="python -m opgen.bench", description=HELP)
    add_arguments(p)
    p.set_defaults(entry="python -m opgen.bench")
    args = p.parse_args(argv)
    try:
        return cmd_bench(args)
    except SpecErrors as e:
        sys.stdout.flush()
        for err in e.errors:
            print(err, file=sys.stderr)
        return 2
    except UserError as e:
        sys.stdout.flush()
        print(f"opgen bench: error: {e}", file=sys.stderr)
        return 2


COMMANDS = (Command("bench", HELP, add_arguments, cmd_bench),)
