"""Where the time of loading tuned kernels in a fresh process goes:

    python3 bench/load_time.py gptq_v2_w4a16_g128 --N 8192 --K 8192 --db DB [--M 1,64]

Run it after `opgen tune` filled DB and the cubin cache (same OPGEN_CACHE_DIR):
it prints the one-time costs of a process (CUDA context, NVRTC version probe,
reading the DB, the code fingerprint) and then each kernel's load (DB lookup,
cubin cache hit, module load), in milliseconds.
"""
import argparse
import json
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("spec")
    p.add_argument("--N", type=int, required=True)
    p.add_argument("--K", type=int, required=True)
    p.add_argument("--M", default="1,64")
    p.add_argument("--db", required=True)
    args = p.parse_args(argv)
    ms = {}

    def lap(name, t0):
        ms[name] = round((time.perf_counter() - t0) * 1e3, 2)

    t = time.perf_counter()
    import cupy
    import opgen
    from opgen.codegen import compiler
    from opgen.runtime.device import current_arch
    from opgen.runtime.tuning_db import TuningDB
    lap("imports", t)
    t = time.perf_counter(); cupy.zeros(1); current_arch(); lap("cuda_context", t)
    t = time.perf_counter(); compiler.nvrtc_version(); lap("nvrtc_version", t)
    t = time.perf_counter(); compiler.code_fingerprint(); lap("code_fingerprint", t)
    t = time.perf_counter(); db = TuningDB(args.db, shipped=False); lap("db_open", t)
    t = time.perf_counter(); op = opgen.load(args.spec, N=args.N, K=args.K, db=db); lap("opgen_load", t)
    for M in (int(m) for m in args.M.split(",")):
        t = time.perf_counter(); op.kernel_for(M); lap(f"kernel_M{M}", t)
    print(json.dumps(dict(ms=ms, sources=op.sources)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
