"""The entry points: `run` (`opgen bench`: plan, time, write the outputs) and
`main` (`python -m opgen.bench`)."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from typing import Optional, Sequence

from opgen.bench import runner
from opgen.bench.plan import _load_specs, add_arguments, resolve_plan
from opgen.bench.report import results_table, targets_section, write_outputs
from opgen.bench.roofline import READ_ONLY_MAX_M, add_read_only, finish_row
from opgen.bench.targets import TARGET_SHAPE, evaluate_targets

def _command_line(args) -> str:
    entry = getattr(args, "entry", "opgen bench")
    rest = sys.argv[1:]
    if entry == "opgen bench" and rest[:1] == ["bench"]:
        rest = rest[1:]
    return " ".join([entry, shlex.join(rest)]).strip()


def run(args: argparse.Namespace) -> int:
    """Run the benchmark (needs a CUDA GPU, torch and cupy)."""
    from opgen.codegen.errors import UserError
    t_start = time.time()
    plan = resolve_plan(args)
    specs = _load_specs(plan.specs)
    from opgen.codegen import planner
    for spec in specs:
        for N, K in plan.shapes:
            try:
                planner.check_shape(spec, N, K)
            except planner.PlanError as e:
                raise UserError(f"{spec.name} at N={N}, K={K}: {e}") from None
    g = runner._Gpu(budget_ms=args.budget_ms, mem_cap=int(args.mem_cap_gb * (1 << 30)), seed=args.seed)
    results = {
        "command": _command_line(args), "argv": list(sys.argv), "cwd": os.getcwd(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "env": g.env(),
        "plan": {"specs": [s.name for s in specs], "shapes": [list(s) for s in plan.shapes],
                 "Ms": list(plan.Ms), "peers": list(plan.peers)},
        "timing": {"budget_ms": args.budget_ms, "method": "CUDA events, launches queued behind a "
                   "spin kernel (runtime.timing.Timer), median of samples, rotating input copies "
                   "(> 2x L2 in total)", "l2_bytes": g.l2},
        "peers": list(plan.peers),
    }
    db = None
    if not args.no_db:
        from opgen.runtime.tuning_db import TuningDB
        db = TuningDB(args.db)
        results["db"] = str(getattr(db, "path", args.db))
    g.log(f"{results['env'].get('device')}: {len(specs)} specs x {len(plan.shapes)} shapes x "
          f"{len(plan.Ms)} Ms")
    rows = results["rows"] = []
    peer_rows = results["peer_rows"] = []
    results["complete"] = False
    # compile in the background while the machine and the peers are timed
    pending = g.start_precompile(specs, plan.shapes, plan.Ms, db, not args.no_db, args.workers)
    try:
        results["measured"] = g.measure_machine()
        peers = {}
        for N, K in plan.shapes:
            peers[N, K] = g.time_peers(plan.peers, N, K, plan.Ms)
            peer_rows += [peers[N, K][M] for M in plan.Ms]
        write_outputs(results, args.out, plots=False)
        g.wait_precompile(pending)
    except BaseException:
        g.wait_precompile(pending, cancel=True)
        raise
    for N, K in plan.shapes:
        by_m = peers[N, K]
        for spec in specs:
            for r in g.time_spec(spec, N, K, plan.Ms, db=db, use_db=not args.no_db,
                                 verify=not args.no_verify):
                pr = by_m[r["M"]]
                for p in plan.peers:
                    r[f"{p}_us"] = pr.get(f"{p}_us")
                r["peer_errors"] = dict(pr.get("errors") or {})
                r = finish_row(r, spec, results["measured"])
                if r["M"] <= READ_ONLY_MAX_M and r.get("bound") == "memory":
                    add_read_only(r, g.read_time(r["bytes"]))
                rows.append(r)
            # keep the files current: a run cut short still leaves its rows behind
            results["targets"] = evaluate_targets(rows)
            results["wall_s"] = round(time.time() - t_start, 1)
            write_outputs(results, args.out, plots=False)
    results["complete"] = True
    results["targets"] = evaluate_targets(rows)
    results["wall_s"] = round(time.time() - t_start, 1)
    paths = write_outputs(results, args.out, plots=not args.no_plots)
    g.log(f"done: {len(rows)} rows in {results['wall_s']:.0f} s")
    print(results_table(rows))
    if any((r["N"], r["K"]) == TARGET_SHAPE for r in rows):
        print()
        print(targets_section(results["targets"]))
    print()
    for p in paths:
        print(p)
    failed = [r for r in rows if r.get("opgen_us") is None or r.get("verified") is False
              or r.get("linear_verified") is False]
    if failed:
        print(f"opgen bench: {len(failed)} row(s) failed or computed wrong results "
              "(see bench.md, Problems)", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m opgen.bench [options]` (the same as `opgen bench`)."""
    from opgen.codegen.errors import SpecErrors, UserError
    p = argparse.ArgumentParser(prog="python -m opgen.bench",
                                description="time opgen's kernels against the peers on this GPU")
    add_arguments(p)
    p.set_defaults(entry="python -m opgen.bench")
    args = p.parse_args(argv)
    try:
        return run(args)
    except SpecErrors as e:
        sys.stdout.flush()
        for err in e.errors:
            print(err, file=sys.stderr)
        return 2
    except UserError as e:
        sys.stdout.flush()
        print(f"opgen bench: error: {e}", file=sys.stderr)
        return 2
