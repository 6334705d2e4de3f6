"""Snapshot of the CUDA that ships: every kernel the shipped tuning DB names,
and the heuristic's pick at the bench's M and shapes (of every shipped spec
and of the execution spec it runs as), rendered and hashed.

    python3 tests/codegen/render_snapshot.py            # rewrite the snapshot
    python3 tests/codegen/render_snapshot.py --check    # compare, list the differences

A restructuring of codegen must leave every entry's hash alone: the hash is
of the source with its comments and whitespace taken out, so moving or
re-wording a comment, or re-indenting a template, does not count as a change,
and anything else does. Each entry also keeps the launch geometry (threads,
shared memory) the planner gives it. `test_render_snapshot.py` runs the check.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from opgen.codegen.source_hash import digest

SNAPSHOT = Path(__file__).with_name("render_snapshot.json")
ARCHES = ("sm_90", "sm_80")
MS = (1, 16, 64, 256, 4096)
SHAPES = ((4096, 4096), (8192, 8192), (28672, 8192), (8192, 28672), (14336, 57344))

def jobs(picks=None):
    """(key, spec, config, arch) for every kernel to snapshot, in a fixed order;
    `picks` (a dict) receives the heuristic's pick at each (spec, arch, shape,
    M) with its grid and dynamic shared memory."""
    from opgen.codegen.resolve import load_spec, shipped_specs
    from opgen.codegen import planner
    from opgen.runtime import tuning_db

    # ... and the execution specs opgen.load runs them as (the DB's records
    # of those carry their names)
    specs = planner.with_execution_specs(load_spec(path) for path in shipped_specs().values())
    out = {}
    db = json.loads(Path(tuning_db.shipped_path()).read_text())
    for key, buckets in db["records"].items():
        name, arch = key.split("|")[0], key.split("|")[2]
        for label, rec in buckets.items():
            cfg = planner.Config.from_dict(rec["config"])
            out[f"db|{name}|{arch}|{cfg.name}"] = (specs[name], cfg, arch)
    for name, spec in specs.items():
        if spec.op != "matmul":
            out[f"quantize|{name}|sm_90"] = (spec, None, "sm_90")
            continue
        for arch in ARCHES:
            for N, K in SHAPES:
                try:
                    planner.check_shape(spec, N, K)
                except planner.PlanError:
                    continue
                for M in MS:
                    cfg = planner.heuristic(spec, arch, M, N, K)
                    if picks is not None:
                        g = planner.geometry(spec, cfg, arch)
                        picks[f"{name}|{arch}|{N}x{K}|M{M}"] = [
                            cfg.name, list(planner.grid(spec, cfg, M, N)), planner.launch_smem(g, cfg, K)]
                    out[f"heuristic|{name}|{arch}|{cfg.name}"] = (spec, cfg, arch)
    return dict(sorted(out.items()))


def render_entry(spec, cfg, arch) -> dict:
    """The digests and geometry of one entry: a predecode config is two kernels."""
    from opgen.codegen import planner, render
    if cfg is None:
        src, g = render.render_quantize(spec, arch)
        return {"kernels": [dict(hash=digest(src), threads=g["threads"])]}
    kernels = []
    for s, c in planner.stages(spec, cfg):
        src, g = render.render(s, c, arch)
        kernels.append(dict(hash=digest(src), threads=g["threads"], smem=g.get("smem", 0),
                            target=g.get("target", arch)))
    return {"kernels": kernels}


def snapshot() -> dict:
    picks = {}
    out = {key: render_entry(*job) for key, job in jobs(picks).items()}
    out.update({f"pick|{k}": v for k, v in picks.items()})
    return out


def differences(old: dict, new: dict) -> list:
    out = [f"missing now: {k}" for k in old if k not in new]
    out += [f"new: {k}" for k in new if k not in old]
    out += [f"changed: {k}: {old[k]} -> {new[k]}" for k in old if k in new and old[k] != new[k]]
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    new = snapshot()
    if "--check" in argv:
        diff = differences(json.loads(SNAPSHOT.read_text()), new)
        kernels = sum(len(v["kernels"]) for v in new.values() if isinstance(v, dict))
        print("\n".join(diff) or f"identical: {len(new)} entries, {kernels} kernels")
        return 1 if diff else 0
    SNAPSHOT.write_text(json.dumps(new, indent=0, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}: {len(new)} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
