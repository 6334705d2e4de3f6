"""The README's H200 tables, printed from a bench JSON (no figure typed in):

    python3 bench/readme_table.py bench/results/h200/bench.json [--N 8192 --K 8192]
    python3 bench/readme_table.py --e2e bench/results/h200/e2e.json

One row per spec (µs per M at the shape), then the peers; medians as the
bench measured them. --e2e: tokens/s by variant and batch from an
`opgen bench --e2e` run."""
import argparse
import json

from opgen.bench.e2e_report import speed_table


def fmt(us):
    if us is None:
        return "—"
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bench_json")
    p.add_argument("--N", type=int, default=8192)
    p.add_argument("--K", type=int, default=8192)
    p.add_argument("--e2e", action="store_true", help="bench_json is an e2e.json")
    a = p.parse_args(argv)
    d = json.load(open(a.bench_json))
    if a.e2e:
        print(speed_table(d["rows"]))
        return 0
    rows = [r for r in d["rows"] if (r["N"], r["K"]) == (a.N, a.K)]
    Ms = sorted({r["M"] for r in rows})
    print("| spec | " + " | ".join(f"M={M}" for M in Ms) + " |")
    print("| --- |" + " ---: |" * len(Ms))
    for spec in dict.fromkeys(r["spec"] for r in rows):
        by_m = {r["M"]: r.get("opgen_us") for r in rows if r["spec"] == spec}
        print(f"| {spec} | " + " | ".join(fmt(by_m.get(M)) for M in Ms) + " |")
    pr = {r["M"]: r for r in d["peer_rows"] if (r["N"], r["K"]) == (a.N, a.K)}
    for peer in d["peers"]:
        print(f"| {peer} | " + " | ".join(fmt(pr.get(M, {}).get(f"{peer}_us")) for M in Ms) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
