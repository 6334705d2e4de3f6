"""`opgen bench`'s run (opgen/bench/entry.py) with a fake GPU: the plan, the
rows finished with their floors and peers, the targets, the files in --out."""
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
    def __init__(self, budget_ms, mem_cap, seed=0):
        self.l2 = 60 << 20

    def log(self, text):
        pass

    def env(self):
        return {"device": "FakeGPU", "torch": "0", "cupy": "0", "nvrtc": "0"}

    def start_precompile(self, *a, **k):
        return "handle"

    def wait_precompile(self, handle, cancel=False):
        assert handle == "handle" and not cancel

    def measure_machine(self):
        return dict(MEAS)

    def time_peers(self, peers, N, K, Ms):
        return {M: {"N": N, "K": K, "M": M, "errors": {"int_mm": "too small"} if M <= 16 else {},
                    **{f"{p}_us": (None if (p == "int_mm" and M <= 16) else 50.0) for p in peers}}
                for M in Ms}

    def time_spec(self, spec, N, K, Ms, db, use_db, verify):
        return [{"spec": spec.name, "N": N, "K": K, "M": M, "opgen_us": 10.0, "config": "c",
                 "source": "heuristic", "verified": True} for M in Ms]

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
