"""`opgen bench`'s run (opgen/bench/entry.py) with a fake GPU: the plan, the
rows finished with their floors and peers (isolated and in graph mode), the
targets, the files in --out."""
import argparse
import json
import sys

from bench_fakes import MEAS
from opgen.bench import runner
from opgen.bench.plan import PEERS
from opgen.cli import bench as cli_bench


def parse(argv):
    p = argparse.ArgumentParser()
    cli_bench.add_arguments(p)
    return p.parse_args(argv)



class _FakeGpuRun:
    arch = "sm_90"
    pdl_Ms = None

    def __init__(self, budget_ms, mem_cap, seed=0):
        self.l2 = 60 << 20

    def log(self, text):
        pass

    def env(self):
        return {"device": "FakeGPU", "torch": "0", "cupy": "0", "nvrtc": "0"}

    def start_precompile(self, specs, shapes, Ms, db, use_db, workers, pdl_Ms=()):
        _FakeGpuRun.pdl_Ms = list(pdl_Ms)
        return "handle"

    def wait_precompile(self, handle, cancel=False):
        assert handle == "handle" and not cancel

    def measure_machine(self):
        return dict(MEAS)

    def time_peers(self, peers, N, K, Ms, *, graph):
        out = {M: {"N": N, "K": K, "M": M, "errors": {"int_mm": "too small"} if M <= 16 else {},
                   **{f"{p}_us": (None if (p == "int_mm" and M <= 16) else 50.0) for p in peers}}
               for M in Ms}
        for M in Ms:
            if graph and M <= 16:
                out[M].update({f"{p}_graph_us": None if p == "int_mm" else 40.0 for p in peers},
                              graph_layers={p: 16 for p in peers},
                              graph_errors={"int_mm": "capture: too small"})
        return out

    def time_spec(self, spec, N, K, Ms, db, use_db, verify, *, graph, pdl):
        rows = [{"spec": spec.name, "N": N, "K": K, "M": M, "opgen_us": 10.0, "config": "c",
                 "source": "heuristic", "verified": True} for M in Ms]
        for r in rows:
            if graph and r["M"] <= 16:
                r.update(opgen_graph_us=8.0, graph_layers=16, graph_bytes=16 << 27,
                         graph_verified=True)
                if pdl:
                    r.update(opgen_graph_pdl_us=7.0, graph_pdl_verified=True, graph_pdl_rel_err=0.0)
        return rows

    def read_time(self, nbytes):
        return 8.0


def test_run_with_fake_gpu(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(runner, "Gpu", _FakeGpuRun)
    monkeypatch.setattr(sys, "argv", ["opgen", "bench", "--quick", "--Ms", "1,64"])
    args = parse(["--quick", "--Ms", "1,64", "--no-db", "--no-plots", "--out", str(tmp_path)])
    assert cli_bench.cmd_bench(args) == 0
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["command"] == "opgen bench --quick --Ms 1,64"
    assert res["env"]["device"] == "FakeGPU" and res["measured"]["copy_tbps"] == 4.0
    assert len(res["rows"]) == 10 * 2 and len(res["peer_rows"]) == 2
    r = res["rows"][0]
    for key in ("spec", "N", "K", "M", "opgen_us", "config", "source", "bytes_floor_us",
                "flops_floor_us", "floor_us", "speedup_vs_cublas_fp16", "pct_of_floor",
                *[f"{p}_us" for p in PEERS]):
        assert key in r, key
    assert r["speedup_vs_cublas_fp16"] == 5.0
    w8 = [x for x in res["rows"] if x["spec"] == "w8a8_int8"]
    assert w8[0]["peer_errors"] == {"int_mm": "too small"} and w8[1]["int_mm_us"] == 50.0
    assert any(t["status"] == "met" for t in res["targets"])
    # memory-bound rows up to M = 16 carry the read-only kernel's time, the others not
    assert r["M"] == 1 and r["bound"] == "memory" and r["read_us"] == 8.0 and r["x_read"] == 1.25
    assert all("read_us" not in x for x in res["rows"] if x["M"] == 64)
    assert all(t.get("read_us") == 8.0 for t in res["targets"] if t["M"] == 1)
    printed = capsys.readouterr().out
    assert "| spec | N x K |" in printed and "## Targets" in printed


def test_run_reports_graph_mode(monkeypatch, tmp_path, capsys):
    """Graph mode is on by default, with its PDL variant: opgen's (plain and
    PDL) and the peers' per-layer figures beside the isolated ones in
    bench.json and bench.md, the graph targets evaluated on the faster;
    no_pdl leaves the PDL variant out, no_graph all of graph mode."""
    monkeypatch.setattr(runner, "Gpu", _FakeGpuRun)
    monkeypatch.setattr(sys, "argv", ["opgen", "bench"])
    args = parse(["--specs", "w4a16_sym_g128", "--shapes", "8192x8192,28672x8192", "--Ms", "1,64",
                  "--no-db", "--no-plots", "--out", str(tmp_path)])
    assert cli_bench.cmd_bench(args) == 0
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["plan"]["graph"] is True and "CUDA graph" in res["timing"]["graph"]
    assert res["plan"]["pdl"] is True and "programmatic dependent launch" in res["timing"]["graph_pdl"]
    r1, r64 = res["rows"][:2]
    assert r1["opgen_graph_us"] == 8.0 and r1["graph_layers"] == 16 and r1["opgen_us"] == 10.0
    assert r1["opgen_graph_pdl_us"] == 7.0 and r1["graph_pdl_verified"] is True
    assert r1["cublas_fp16_graph_us"] == 40.0 and r1["int_mm_graph_us"] is None
    assert r1["peer_graph_errors"] == {"int_mm": "capture: too small"}
    assert r1["graph_x_isolated"] == 0.8 and r1["graph_x_bytes_floor"] is not None
    assert not any("graph" in k for k in r64)
    assert res["peer_rows"][0]["graph_layers"]["cublas_fp16"] == 16
    graph_targets = [t for t in res["targets"] if t["mode"] == "graph"
                     and t["spec"] == "w4a16_sym_g128"]
    assert [(t["N"], t["M"]) for t in graph_targets] == [(8192, 1), (28672, 1)]
    assert all(t["opgen_graph_us"] == 7.0 and t["graph_launch"] == "pdl" and t["status"] == "met"
               for t in graph_targets)
    assert _FakeGpuRun.pdl_Ms == [1]          # graph mode's PDL kernels compiled ahead too
    md = (tmp_path / "bench.md").read_text()
    assert "## Graph mode (L layers back to back, one CUDA graph)" in md
    assert "| PDL µs/layer |" in md
    assert "## Graph-mode targets (8192x8192, 28672x8192; µs per layer)" in md
    assert "- torch._int_mm: capture: too small" in md
    printed = capsys.readouterr().out
    assert "| graph µs/layer |" in printed

    args = parse(["--specs", "w4a16_sym_g128", "--shapes", "8192x8192,28672x8192", "--Ms", "1,64",
                  "--no-db", "--no-plots", "--no-pdl", "--out", str(tmp_path)])
    assert args.no_pdl
    assert cli_bench.cmd_bench(args) == 0
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["plan"]["graph"] is True and res["plan"]["pdl"] is False and _FakeGpuRun.pdl_Ms == []
    assert res["timing"]["graph_pdl"] is None and res["rows"][0]["opgen_graph_us"] == 8.0
    assert not any("pdl" in k for r in res["rows"] for k in r)
    assert all(t["graph_launch"] == "plain" for t in res["targets"] if t["mode"] == "graph"
               and t["spec"] == "w4a16_sym_g128")

    args = parse(["--specs", "w4a16_sym_g128", "--shapes", "8192x8192,28672x8192", "--Ms", "1,64",
                  "--no-db", "--no-plots", "--no-graph", "--out", str(tmp_path)])
    assert args.no_graph
    assert cli_bench.cmd_bench(args) == 0
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["plan"]["graph"] is False and res["timing"]["graph"] is None
    assert res["plan"]["pdl"] is False and res["timing"]["graph_pdl"] is None
    assert not any("graph" in k for r in res["rows"] for k in r)
    assert "## Graph mode" not in (tmp_path / "bench.md").read_text()
