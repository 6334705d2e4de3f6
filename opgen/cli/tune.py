"""`opgen tune SPEC... | --all  --shapes NxK,... | --N --K | --model PATH  [--M 1,16,64]
[--gpus ID,... | --ray [ADDRESS]] [--force]`: runtime.tuner.tune_many from the command
line (in this process, on one GPU), or runtime.tune_pool.tune_pairs (a worker per local
GPU, or Ray tasks), and its report."""
from __future__ import annotations

import argparse
import statistics
from typing import List, Tuple

from ..bench.plan import matmul_specs, shipped_matmul_specs
from ..checkpoints import stack_refusal
from ..codegen import planner
from ..codegen.errors import UserError
from ..model_shapes import linear_shapes, model_config, shipped_models
from ..runtime import tune_pool, tuner
from ..runtime.device import NoGPUError
from ..runtime.tune_ray import RayWorkers
from ..runtime.timing import BUDGET_MS, RANK_BUDGET_MS
from ..runtime.tuning_db import TuningDB, TuningDBError, speedup
from .args import parse_ints, parse_names, parse_shapes, positive_float, positive_int
from .command import Command
from .table import format_table

DESCRIPTION = ("Time the planner's candidate configs of every spec at every shape and M bucket "
               "on this GPU (all of them on a short budget, then the fastest few and the "
               "heuristic's pick in full), verify them, and store the fastest correct one per "
               "bucket in the tuning DB.")


def _tune_args(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    p.add_argument("spec", nargs="*", metavar="SPEC", help="spec names or YAML files")
    p.add_argument("--all", action="store_true", help="every shipped matmul spec")
    p.add_argument("--shapes", type=parse_shapes, default=None, metavar="NxK,...",
                   help="weight shapes N x K, e.g. 4096x4096,8192x8192")
    p.add_argument("--N", type=positive_int, default=None, help="with --K: one shape")
    p.add_argument("--K", type=positive_int, default=None)
    p.add_argument("--model", metavar="NAME|PATH", default=None,
                   help="a shipped model (" + ", ".join(shipped_models()) + ") or a Hugging Face "
                        "config.json or model directory: every distinct N x K of its linear "
                        "layers (a spec's alignment rules may skip some)")
    p.add_argument("--lm-head", action="store_true", help="with --model: lm_head's shape too")
    p.add_argument("--fused", action=argparse.BooleanOptionalAction, default=None,
                   help="with --model: the wider layers of fused siblings too (q+k+v, gate+up), "
                        "which replace_linear and load_quantized run by default (default: on; "
                        "--no-fused: the separate layers only)")
    p.add_argument("--M", type=parse_ints, default=None, metavar="M,...",
                   help="comma-separated M values, one per bucket "
                        "(default: every bucket at its representative M)")
    p.add_argument("--db", help="tuning DB file (default: $OPGEN_TUNING_DB or ~/.cache/opgen/tuning.json)")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="compile processes (default: all cores but one; 1: compile everything "
                        "first, in this process)")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="samples per config in the final pass (default: adaptive)")
    p.add_argument("--budget-ms", type=positive_float, default=BUDGET_MS,
                   help=f"device time per config in the final pass (default {BUDGET_MS:g})")
    p.add_argument("--rank-budget-ms", type=positive_float, default=RANK_BUDGET_MS,
                   help=f"device time per candidate in the rank pass (default {RANK_BUDGET_MS:g})")
    p.add_argument("--finalists", type=positive_int, default=tuner.FINALISTS,
                   help="rank-pass leaders timed again in full, with the heuristic's pick "
                        f"(default {tuner.FINALISTS})")
    p.add_argument("--seed", type=int, default=0, help="of the random problems")
    p.add_argument("--gpus", type=parse_names, default=None, metavar="ID,...",
                   help="local GPUs to tune on, one worker process each, a (spec, shape) pair "
                        "at a time (default: every visible GPU; with one, in this process)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="tune on a Ray cluster, each (spec, shape) pair a task holding one GPU "
                        "(ADDRESS: e.g. auto, ray://head:10001; default: $RAY_ADDRESS, else a "
                        "local Ray); needs pip install 'opgen[ray]' on every node")
    p.add_argument("--force", action="store_true",
                   help="tune again the pairs the DB already has for the GPU (default: skip a "
                        "pair whose every requested bucket is stored for that device)")
    p.add_argument("--quiet", action="store_true", help="no progress line")


def specs_and_shapes(args):
    """(specs, shapes, wide, notes) of the command line; a UserError names
    the argument at fault. With --model, the shapes are the model's
    (model_shapes.linear_shapes), `wide` those only its fused siblings have,
    and a note says which layers have each."""
    if args.all and args.spec:
        raise UserError("give SPEC names or --all, not both")
    if not args.all and not args.spec:
        raise UserError("no spec: give SPEC names (or --all for every shipped matmul spec)")
    if args.model is not None and (args.shapes or args.N is not None or args.K is not None):
        raise UserError("--model and --shapes/--N/--K both given: use one")
    if args.lm_head and args.model is None:
        raise UserError("--lm-head goes with --model")
    if args.fused is not None and args.model is None:
        raise UserError("--fused / --no-fused go with --model")
    if args.shapes and (args.N is not None or args.K is not None):
        raise UserError("--shapes and --N/--K both given: use one")
    if (args.N is None) != (args.K is None):
        raise UserError("--N and --K go together (or give --shapes NxK)")
    notes, wide = [], []
    if args.model is not None:
        config, source = model_config(args.model)
        found = linear_shapes(config, source, lm_head=args.lm_head, fused=args.fused is not False)
        shapes = [(s.N, s.K) for s in found]
        separate = {(s.N, s.K) for s in linear_shapes(config, source, lm_head=args.lm_head)}
        wide = [shape for shape in shapes if shape not in separate]
        notes.append(f"{source}: {len(found)} distinct linear shape(s) (N x K): "
                     + "; ".join(f"{s.N}x{s.K} ({', '.join(s.layers)})" for s in found))
    else:
        shapes = args.shapes or ([(args.N, args.K)] if args.N is not None else None)
    if not shapes:
        raise UserError("no shape: give --shapes NxK[,NxK...] (or --N and --K, or --model)")
    names = shipped_matmul_specs() if args.all else list(dict.fromkeys(args.spec))
    return matmul_specs(names, command="opgen tune"), shapes, wide, notes


def tune_groups(args) -> Tuple[List[Tuple[list, list]], List[str]]:
    """The tune_many calls of the command line, each (specs, shapes), and
    notes on what is skipped. A shape given with --shapes/--N/--K that a
    spec refuses is an error; one of a --model is skipped with a note (a
    model's K need not fit every spec's group), and specs that take the same
    shapes are tuned in one call (their compiles overlap the timing). A
    spec whose layers never stack (stack_refusal) skips the fused siblings'
    shapes."""
    specs, shapes, wide, notes = specs_and_shapes(args)
    groups, skipped = {}, []
    for spec in specs:
        taken = []
        refusal = stack_refusal(spec) if wide else None
        if refusal:
            skipped.append(f"skipped {spec.name} at the fused siblings' shape(s) "
                           f"{', '.join(f'{N}x{K}' for N, K in wide)}: {refusal}")
        for N, K in shapes:
            if refusal and (N, K) in wide:
                continue
            try:
                planner.check_shape(spec, N, K)
                taken.append((N, K))
            except planner.PlanError as e:
                if args.model is None:
                    raise UserError(f"{spec.name} at N={N}, K={K} (--shapes/--N/--K): {e}") from None
                skipped.append(f"skipped {spec.name} at N={N} K={K}: {e}")
        if taken:
            groups.setdefault(tuple(taken), []).append(spec)
    if not groups:
        raise UserError(f"--model {args.model}: no shape of its linear layers fits the given "
                        f"spec(s): " + "; ".join(skipped))
    return ([(group_specs, list(group_shapes)) for group_shapes, group_specs in groups.items()],
            notes + skipped)


def cmd_tune(args: argparse.Namespace) -> int:
    groups, notes = tune_groups(args)
    try:
        TuningDB(args.db).check_writable()
    except TuningDBError as e:
        raise UserError(f"--db: {e}") from None
    if args.ray is not None and args.gpus is not None:
        raise UserError("--gpus is for local workers; with --ray, Ray places the tasks")
    for note in notes:
        print(note, flush=True)
    pairs = [(spec, N, K) for specs, shapes in groups for spec in specs for N, K in shapes]
    policy = dict(workers=args.workers, repeats=args.repeats, budget_ms=args.budget_ms,
                  rank_budget_ms=args.rank_budget_ms, finalists=args.finalists, seed=args.seed)
    if args.ray is not None:
        backend = RayWorkers(args.ray or None)
    else:
        gpus = tune_pool.visible_gpus()
        if args.gpus is not None and not gpus:
            raise NoGPUError("--gpus: no usable CUDA GPU here")
        # one GPU: tune_many in this process, its compiles overlapping the timing
        backend = tune_pool.LocalWorkers(args.gpus or gpus) if args.gpus or len(gpus) > 1 else None
    devices = None
    if backend is None:
        run, skipped = tune_here(args, pairs, policy)
    else:
        pool = tune_pool.tune_pairs(pairs, backend, Ms=args.M, db=args.db, force=args.force,
                                    progress=not args.quiet, **policy)
        run, devices = pool.tune_run(), pool.devices()
        skipped = [(o.task.name(), o.device) for o in pool.skipped()]
    print(report(run, args.db or TuningDB().path))
    if skipped:
        print(f"skipped {len(skipped)} pair(s) the DB already has for their device (--force "
              "tunes them again): " + "; ".join(f"{n} ({d})" for n, d in skipped))
    if devices is not None:
        print(device_summary(devices))
    if run.interrupted:
        return 130                   # as a shell reports SIGINT
    return 0 if all(r.ok() for r in run.results) else 1


def tune_here(args, pairs, policy) -> Tuple[tuner.TuneRun, List[Tuple[str, str]]]:
    """tune_many in this process, on its GPU, for the pairs the DB does not
    have yet for it (all with --force): specs that still take the same
    shapes share a call (their compiles overlap the timing).  Returns the
    run and the skipped pairs, each (name, device)."""
    tasks = tune_pool.plan_tasks(pairs, args.M, args.db, args.force)
    here = tune_pool.device_here() if any(t.done_on for t in tasks) else None
    skipped = [(t.name(), here[1]) for t in tasks if here in t.done_on]
    todo = {}
    for t in tasks:
        if here not in t.done_on:
            todo.setdefault(t.spec, []).append((t.N, t.K))
    groups = {}
    for spec, shapes in todo.items():
        groups.setdefault(tuple(shapes), []).append(spec)
    runs = []
    for shapes, specs in groups.items():
        runs.append(tuner.tune_many(specs, list(shapes), Ms=args.M, db=args.db,
                                    progress=not args.quiet, **policy))
        if runs[-1].interrupted:
            break
    return merged(runs), skipped


def device_summary(devices: List[tune_pool.DeviceTally]) -> str:
    """A row per device of a run over several workers."""
    rows = [[t.device, ", ".join(sorted(t.workers)), t.tuned, t.partial, t.failed, t.skipped,
             t.records, t.busy_s] for t in devices]
    return "per device:\n" + format_table(["device", "workers", "tuned", "partly", "failed",
                                           "skipped", "records", "busy s"], rows)


def merged(runs: List[tuner.TuneRun]) -> tuner.TuneRun:
    """One TuneRun of several tune_many calls, for one report."""
    if len(runs) == 1:
        return runs[0]
    return tuner.TuneRun([r for run in runs for r in run.results],
                         plan_s=sum(r.plan_s for r in runs), kernels=sum(r.kernels for r in runs),
                         kernels_failed=sum(r.kernels_failed for r in runs),
                         compile_s=sum(r.compile_s for r in runs),
                         total_s=sum(r.total_s for r in runs),
                         interrupted=any(r.interrupted for r in runs))


# The heuristic is to stay within this of the tuned winner on shapes never
# tuned (issue 27: `opgen tune --model` of a model the DB has not seen).
HEURISTIC_WITHIN = 1.15


def heuristic_summary(run: tuner.TuneRun) -> str:
    """One line: the heuristic's pick against the winner over every stored
    bucket (its time / the winner's), the median, the worst and how many
    buckets are over HEURISTIC_WITHIN; "" when no record has both."""
    got = sorted(((x, f"{res.spec_name} {res.N}x{res.K} {b}") for res in run.results
                  for b, r in res.items() for x in [speedup(r)] if x is not None), key=lambda t: t[0])
    if not got:
        return ""
    over = [where for x, where in got if x > HEURISTIC_WITHIN]
    return (f"heuristic / tuned: median {statistics.median(x for x, _ in got):.2f}x, worst {got[-1][0]:.2f}x "
            f"({got[-1][1]}); {len(over)} of {len(got)} bucket(s) over {HEURISTIC_WITHIN}x")


def report(run: tuner.TuneRun, db_path) -> str:
    """A table per (spec, shape), what failed, and where the time went."""
    out: List[str] = []
    for res in run.results:
        head = f"== {res.spec_name}  N={res.N} K={res.K}"
        if res.error is not None:
            out += [f"{head}: NOT tuned ({res.error})", ""]
            continue
        rows = [[b, r["M"], r.get("config_name", ""), r["median_us"], r.get("heuristic_us"),
                 speedup(r)] for b, r in res.items()]
        out.append(f"{head}  ({res.seconds:.1f} s)")
        if rows:
            out.append(format_table(["bucket", "M", "best config", "us", "heuristic us",
                                     "speedup"], rows))
            out.append(f"stored {len(res)} record(s) under {res.key}")
        for b, why in res.untuned.items():
            out.append(f"bucket {b}: NOT tuned ({why})")
        if res.launch_failed:
            out.append(f"{len(res.launch_failed)} config(s) failed to launch: "
                       + "; ".join(f"{n}: {w}" for n, w in list(res.launch_failed.items())[:3]))
        if res.compile_failed:
            out.append(f"{len(res.compile_failed)} config(s) did not compile")
        out.append("")
    summary = heuristic_summary(run)
    if summary:
        out.append(summary)
    stored = sum(len(r) for r in run.results)
    wanted = sum(len(r) + len(r.untuned) for r in run.results if r.error is None)
    timing_s = sum(r.seconds for r in run.results)
    out.append(f"stored {stored} record(s) of {wanted} bucket(s), {len(run.results)} "
               f"(spec, shape) pair(s), in {db_path}")
    out.append(f"total {run.total_s:.1f} s: planning {run.plan_s:.1f} s, compiling {run.kernels} "
               f"kernels {run.compile_s:.1f} s ({run.kernels_failed} failed), timing + "
               f"verification {timing_s:.1f} s (the GPU times while the later specs compile)")
    return "\n".join(out)


COMMANDS = (Command("tune", "tune tile configs on this GPU and store the winners", _tune_args,
                    cmd_tune),)
