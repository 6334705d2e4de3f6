"""`opgen bench`'s run: plan, time, write the outputs (the command line that
starts it: opgen/cli/bench.py)."""
from __future__ import annotations

import argparse
import os
import sys
import time

from ..codegen import planner, render
from ..codegen.errors import UserError
from ..runtime.tuning_db import TuningDB
from . import graph as graph_mode
from . import runner
from .plan import matmul_specs, resolve_plan
from .report import graph_table, results_table, targets_section, write_outputs
from .roofline import READ_ONLY_MAX_M, add_read_only, finish_row
from .targets import TARGET_SHAPE, evaluate_targets


def run(args: argparse.Namespace, command: str) -> int:
    """Run the benchmark (needs a CUDA GPU, torch and cupy); args: `opgen
    bench`'s options, command: the command line as typed (for bench.json)."""
    t_start = time.time()
    plan = resolve_plan(args)
    specs = matmul_specs(plan.specs)
    for spec in specs:
        for N, K in plan.shapes:
            try:
                planner.check_shape(spec, N, K)
            except planner.PlanError as e:
                raise UserError(f"{spec.name} at N={N}, K={K}: {e}") from None
    g = runner.Gpu(budget_ms=args.budget_ms, mem_cap=int(args.mem_cap_gb * (1 << 30)), seed=args.seed)
    results = {
        "command": command, "argv": list(sys.argv), "cwd": os.getcwd(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "env": g.env(),
        "plan": {"specs": [s.name for s in specs], "shapes": [list(s) for s in plan.shapes],
                 "Ms": list(plan.Ms), "peers": list(plan.peers), "graph": plan.graph,
                 "pdl": plan.graph and plan.pdl},
        "timing": {"budget_ms": args.budget_ms, "method": "CUDA events, launches queued behind a "
                   "spin kernel (runtime.timing.Timer), median of samples, rotating input copies "
                   "(> 2x L2 in total)", "l2_bytes": g.l2,
                   "graph": graph_mode.METHOD if plan.graph else None,
                   "graph_pdl": graph_mode.PDL_METHOD if plan.graph and plan.pdl else None},
        "peers": list(plan.peers),
    }
    db = None
    if not args.no_db:
        db = TuningDB(args.db)
        results["db"] = str(getattr(db, "path", args.db))
    g.log(f"{results['env'].get('device')}: {len(specs)} specs x {len(plan.shapes)} shapes x "
          f"{len(plan.Ms)} Ms")
    rows = results["rows"] = []
    peer_rows = results["peer_rows"] = []
    results["complete"] = False
    # compile in the background while the machine and the peers are timed
    pdl_Ms = [M for M in plan.Ms if M <= graph_mode.MAX_M] \
        if plan.graph and plan.pdl and render.pdl_available(g.arch) else []
    pending = g.start_precompile(specs, plan.shapes, plan.Ms, db, not args.no_db, args.workers,
                                 pdl_Ms)
    try:
        results["measured"] = g.measure_machine()
        peers = {}
        for N, K in plan.shapes:
            peers[N, K] = g.time_peers(plan.peers, N, K, plan.Ms, graph=plan.graph)
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
                                 verify=not args.no_verify, graph=plan.graph, pdl=plan.pdl):
                pr = by_m[r["M"]]
                for p in plan.peers:
                    r[f"{p}_us"] = pr.get(f"{p}_us")
                r["peer_errors"] = dict(pr.get("errors") or {})
                if "graph_errors" in pr:          # the peers' graph mode at this M
                    for p in plan.peers:
                        r[f"{p}_graph_us"] = pr.get(f"{p}_graph_us")
                    r["peer_graph_errors"] = dict(pr["graph_errors"])
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
    graphs = graph_table(rows)
    if graphs:
        print()
        print(graphs)
    if any((r["N"], r["K"]) == TARGET_SHAPE for r in rows):
        print()
        print(targets_section(results["targets"]))
    print()
    for p in paths:
        print(p)
    failed = [r for r in rows if r.get("opgen_us") is None or r.get("verified") is False
              or r.get("linear_verified") is False or r.get("graph_verified") is False
              or r.get("graph_pdl_verified") is False]
    if failed:
        print(f"opgen bench: {len(failed)} row(s) failed or computed wrong results "
              "(see bench.md, Problems)", file=sys.stderr)
    return 1 if failed else 0
