"""`opgen bench` on CPU: argument parsing, the floor arithmetic, the target
evaluation, the Markdown writer, the tiled-data check, and the orchestration
with a fake GPU.  No GPU needed; torch (CPU) only for the tests that drive
the GPU-side code with torch CPU tensors, skipped without it."""
import argparse
import contextlib
import json
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from opgen import bench
from opgen.codegen.reference import (dequantize, random_activation, random_weight_tensors,
                                     reference_matmul_f32)
from opgen.codegen.validate import load_spec, shipped_specs


def spec(name):
    return load_spec(shipped_specs()[name])


def parse(argv):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return p.parse_args(argv)


# --- arguments --------------------------------------------------------------------

def test_parse_shapes_and_ints():
    assert bench.parse_shapes("8192x8192, 4096X14336,8192*28672") == [
        (8192, 8192), (4096, 14336), (8192, 28672)]
    assert bench.parse_shapes("64x64,64x64") == [(64, 64)]
    assert bench.parse_ints("1,16, 64,16") == [1, 16, 64]
    for bad in ("8192", "axb", "0x8", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_shapes(bad)
    for bad in ("0", "1,x", "", "-4"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_ints(bad)


def test_defaults_and_quick():
    args = parse([])
    assert args.out == "bench/results/h200" and not args.quick and args.budget_ms > 0
    full = bench.resolve_plan(args, shipped_matmul=["a", "b"])
    assert full.specs == ("a", "b")
    assert full.shapes == ((4096, 4096), (8192, 8192), (28672, 8192), (8192, 28672), (14336, 57344))
    assert full.Ms == (1, 16, 32, 64, 128, 256, 1024, 4096)
    assert full.peers == bench.PEERS

    quick = bench.resolve_plan(parse(["--quick"]), shipped_matmul=["a"])
    assert quick.shapes == ((8192, 8192),) and quick.Ms == (1, 16, 64, 256, 4096)
    assert quick.specs == ("gptq_v2_w4a16_g128", "gptq_v2_w4a16_g128_repacked", "w4a16_sym_g128",
                           "w2a16_g128", "w1a16_g128", "bitnet_b158", "bnb_nf4", "mxfp4", "w8a8_int8",
                           "fp8_e4m3_w8a8")
    # explicit choices win over --quick; Ms come out sorted; the baseline peer is always timed
    p = bench.resolve_plan(parse(["--quick", "--specs", "fp16", "--Ms", "64,1", "--shapes",
                                  "4096x4096", "--peers", "int_mm"]))
    assert p.specs == ("fp16",) and p.Ms == (1, 64) and p.shapes == ((4096, 4096),)
    assert p.peers == ("cublas_fp16", "int_mm")
    with pytest.raises(SystemExit):
        parse(["--peers", "cutlass"])


def test_default_specs_are_the_shipped_matmuls():
    names = bench.shipped_matmul_specs()
    assert "gptq_v2_w4a16_g128" in names and "fp16" in names
    assert not any(n.startswith("quantize_") for n in names)
    for n in bench.QUICK_SPECS:
        assert n in names


def test_cli_registers_bench():
    from opgen import cli
    args = cli.make_parser().parse_args(["bench", "--quick", "--Ms", "1,16", "--out", "x"])
    assert args._run is cli.cmd_bench
    assert args.Ms == [1, 16] and args.out == "x" and args.entry == "opgen bench"


def test_import_needs_neither_torch_nor_cupy():
    code = ("import sys, argparse; import opgen.bench as b; from opgen import cli; "
            "cli.make_parser().parse_args(['bench', '--quick']); "
            "b.markdown({'rows': [], 'targets': []}); "
            "print('torch' in sys.modules, 'cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_command_line(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/usr/bin/opgen", "bench", "--quick", "--out", "a b"])
    assert bench._command_line(parse([])) == "opgen bench --quick --out 'a b'"
    monkeypatch.setattr(sys, "argv", ["/x/opgen/bench/__main__.py", "--quick"])
    ns = parse([])
    ns.entry = "python -m opgen.bench"
    assert bench._command_line(ns) == "python -m opgen.bench --quick"


# --- floors -----------------------------------------------------------------------

def test_bytes_gptq_8192():
    N = K = 8192
    s = spec("gptq_v2_w4a16_g128")
    st = bench.storage_bytes(s, N, K)
    assert st == {"qweight": N * K // 2, "scales": (K // 128) * N * 2, "zeros": (K // 128) * (N // 8) * 4}
    for M in (1, 16, 4096):
        assert bench.bytes_moved(s, M, N, K) == (N * K // 2 + (K // 128) * N * 2
                                                 + (K // 128) * (N // 8) * 4 + M * K * 2 + M * N * 2)


@pytest.mark.parametrize("name, weights", [
    ("gptq_v1_w4a16_g128", lambda N, K: N * K // 2 + K // 128 * N * 2 + K // 128 * N // 8 * 4),
    ("awq_w4a16_g128", lambda N, K: N * K // 2 + K // 128 * N * 2 + K // 128 * N // 8 * 4),
    ("w4a16_sym_g128", lambda N, K: N * K // 2 + N * K // 128 * 2),
    ("w2a16_g128", lambda N, K: N * K // 4 + N * K // 128 * 2),
    ("w1a16_g128", lambda N, K: N * K // 8 + 2 * (N * K // 128 * 2)),
    ("bitnet_b158", lambda N, K: N * K // 4 + 4),
    ("bnb_nf4", lambda N, K: N * K // 2 + N * K // 64 * 4),
    ("mxfp4", lambda N, K: N * K // 2 + N * K // 32),
    ("fp16", lambda N, K: N * K * 2),
    ("fp8_e4m3_w8a16", lambda N, K: N * K + N * 4),
])
def test_bytes_fp16_activation_specs(name, weights):
    N, K = 28672, 8192
    s = spec(name)
    assert sum(bench.storage_bytes(s, N, K).values()) == weights(N, K)
    assert bench.bytes_moved(s, 16, N, K) == weights(N, K) + 16 * K * 2 + 16 * N * 2


def test_bytes_w8a8_specs():
    N, K, M = 8192, 8192, 64
    # int8 weights + f32 channel scales, int8 a + f32 row scales, fp16 out
    assert bench.bytes_moved(spec("w8a8_int8"), M, N, K) == N * K + 4 * N + M * K + 4 * M + 2 * M * N
    # fp8 the same, bf16 out
    assert bench.bytes_moved(spec("fp8_e4m3_w8a8"), M, N, K) == N * K + 4 * N + M * K + 4 * M + 2 * M * N


@pytest.mark.parametrize("name", bench.shipped_matmul_specs())
def test_bytes_match_the_reference_arrays(name):
    """storage_bytes = the nbytes of what random_weight_tensors makes (every spec)."""
    s = spec(name)
    N, K, M = 256, 512, 3
    w = random_weight_tensors(s, N, K, np.random.default_rng(0))
    assert bench.storage_bytes(s, N, K) == {k: v.nbytes for k, v in w.items()}
    assert bench.stored_shapes(s, N, K) == {k: v.shape for k, v in w.items()}
    a, a_scale = random_activation(s, M, K, np.random.default_rng(1))
    out_b = {"float16": 2, "bfloat16": 2, "float32": 4}[s.out.dtype]
    extra = 0 if a_scale is None else a_scale.nbytes
    assert bench.bytes_moved(s, M, N, K) == sum(v.nbytes for v in w.values()) + a.nbytes + extra \
        + M * N * out_b


MEAS = {"copy_tbps": 4.0, "fp16_tflops": 800.0, "int8_tops": 1600.0, "fp8_tflops": 1500.0}


def test_floors_memory_and_compute_bound():
    s = spec("gptq_v2_w4a16_g128")
    N = K = 8192
    f1 = bench.floors(s, 1, N, K, MEAS)
    assert f1["bound"] == "memory"
    assert f1["bytes_floor_us"] == pytest.approx(bench.bytes_moved(s, 1, N, K) / 4e6, abs=1e-4)
    assert f1["flops_floor_us"] == pytest.approx(2 * N * K / 800e6, abs=1e-4)
    assert f1["floor_us"] == f1["bytes_floor_us"]
    f4k = bench.floors(s, 4096, N, K, MEAS)
    assert f4k["bound"] == "compute"
    assert f4k["floor_us"] == pytest.approx(2 * 4096 * N * K / 800e6, rel=1e-6)
    # int8 / fp8 activations use their own ceilings; fp8 falls back to int8's
    assert bench.floors(spec("w8a8_int8"), 4096, N, K, MEAS)["flops_floor_us"] == \
        pytest.approx(2 * 4096 * N * K / 1600e6, rel=1e-6)
    no_fp8 = {k: v for k, v in MEAS.items() if k != "fp8_tflops"}
    assert bench.floors(spec("fp8_e4m3_w8a8"), 4096, N, K, no_fp8)["flops_floor_us"] == \
        pytest.approx(2 * 4096 * N * K / 1600e6, rel=1e-6)
    # nothing measured: no floor, no crash
    assert bench.floors(s, 1, N, K, {})["floor_us"] is None


def test_finish_row():
    s = spec("gptq_v2_w4a16_g128")
    row = {"spec": s.name, "N": 8192, "K": 8192, "M": 1, "opgen_us": 10.0,
           "cublas_fp16_us": 45.0, "tinygemm_int4_us": 25.0}
    bench.finish_row(row, s, MEAS)
    assert row["speedup_vs_cublas_fp16"] == 4.5
    assert row["relevant_peer"] == "tinygemm_int4" and row["speedup_vs_peer"] == 2.5
    assert row["pct_of_floor"] == pytest.approx(100 * row["floor_us"] / 10.0, abs=0.01)
    assert bench.relevant_peer(spec("w8a8_int8")) == "int_mm"
    assert bench.relevant_peer(spec("fp8_e4m3_w8a8")) == "scaled_mm"
    assert bench.relevant_peer(spec("bnb_nf4")) is None
    failed = bench.finish_row({"spec": "x", "N": 64, "K": 64, "M": 1, "opgen_us": None,
                               "cublas_fp16_us": 3.0}, s, MEAS)
    assert failed["speedup_vs_cublas_fp16"] is None and failed["pct_of_floor"] is None


# --- targets ----------------------------------------------------------------------

def _row(spec_name, M, opgen, N=8192, K=8192, **peers):
    r = {"spec": spec_name, "N": N, "K": K, "M": M, "opgen_us": opgen, "peer_errors": {}}
    for k, v in peers.items():
        r[k] = v
    return r


SYNTH = [
    _row("gptq_v2_w4a16_g128", 1, 10.0, cublas_fp16_us=50.0, tinygemm_int4_us=15.0),
    _row("w4a16_sym_g128", 1, 11.0, cublas_fp16_us=44.0, tinygemm_int4_us=30.0),
    _row("gptq_v2_w4a16_g128", 16, 10.0, cublas_fp16_us=33.0),
    _row("gptq_v2_w4a16_g128", 4096, 1000.0, cublas_fp16_us=800.0),
    _row("gptq_v2_w4a16_g128", 1, 1.0, N=4096, K=4096, cublas_fp16_us=1.0),   # other shape: ignored
    _row("w2a16_g128", 1, 14.0, bytes_floor_us=10.0),
    _row("bnb_nf4", 1, 20.0, bytes_floor_us=10.0),
    _row("w8a8_int8", 16, 10.0, int_mm_us=None),                              # M < 64: not a target
    _row("w8a8_int8", 64, 10.0, int_mm_us=9.0, opgen_linear_us=15.0, bminf_w8a8_us=30.0,
         linear_verified=True),
    _row("w8a8_int8", 256, 10.0, int_mm_us=12.0),
    _row("fp8_e4m3_w8a8", 256, 10.0, scaled_mm_us=None),
    _row("mxfp4", 1, None, error="CompileError: boom"),
]
SYNTH[-2]["peer_errors"] = {"scaled_mm": "RuntimeError: not supported"}


def _find(targets, label, spec_name=None, M=None):
    out = [t for t in targets if t["target"] == label and (spec_name is None or t["spec"] == spec_name)
           and (M is None or t["M"] == M)]
    assert len(out) == 1, (label, spec_name, M, out)
    return out[0]


def test_evaluate_targets():
    t = bench.evaluate_targets(SYNTH)
    m1 = _find(t, "W4A16 g128 M=1 vs cuBLAS fp16", "gptq_v2_w4a16_g128")
    assert m1["status"] == "met" and m1["ratio"] == 5.0 and m1["need"] == 4.5
    assert _find(t, "W4A16 g128 M=1 vs cuBLAS fp16", "w4a16_sym_g128")["status"] == "missed"   # 4.0x
    tg = _find(t, "W4A16 g128 M=1 vs tinygemm", "gptq_v2_w4a16_g128")
    assert tg["status"] == "missed" and tg["ratio"] == 1.5
    assert _find(t, "W4A16 g128 M=1 vs tinygemm", "w4a16_sym_g128")["status"] == "met"
    assert _find(t, "W4A16 g128 M=16 vs cuBLAS fp16")["status"] == "missed"       # 3.3 < 3.4
    assert _find(t, "W4A16 g128 M=4096 vs cuBLAS fp16")["status"] == "met"        # 0.8 >= 0.8
    assert _find(t, "W4A16 g128 M=64 vs cuBLAS fp16")["status"] == "not measured"
    w2 = _find(t, "W2A16 M=1 within 1.4x of byte floor")
    assert w2["status"] == "met" and w2["ratio"] == 1.4 and w2["op"] == "<="
    assert _find(t, "NF4 M=1 within 1.5x of byte floor")["status"] == "missed"    # 2.0x
    mx = _find(t, "MXFP4 M=1 within 1.5x of byte floor")
    assert mx["status"] == "n/a" and "boom" in mx["why"]
    assert _find(t, "W1A16 M=1 within 1.4x of byte floor")["status"] == "not measured"
    w8 = [x for x in t if x["target"].startswith("W8A8")]
    assert [(x["M"], x["status"]) for x in w8] == [(64, "missed"), (256, "met")]
    fp8 = _find(t, "FP8 >= 0.9x torch._scaled_mm, M >= 256")
    assert fp8["status"] == "n/a" and "not supported" in fp8["why"]
    # every entry is at N = K = 8192
    assert {(x["N"], x["K"]) for x in t} == {(8192, 8192)}


# --- Markdown ---------------------------------------------------------------------

def _results():
    rows = []
    for r in SYNTH:
        r = dict(r)
        r.setdefault("config", "gemv_m1_w4_v16_s8")
        r.setdefault("source", "heuristic")
        r["verified"] = True if r.get("opgen_us") else None
        rows.append(bench.finish_row(r, spec(r["spec"]), MEAS))
    rows[2]["verified"] = False
    rows[2]["verify_msg"] = "relative error 1.0e+00 > 4.0e-03"
    return {"command": "opgen bench --quick", "env": {"device": "NVIDIA H200", "torch": "2.11"},
            "measured": MEAS, "rows": rows,
            "peer_rows": [{"N": 8192, "K": 8192, "M": 1, "cublas_fp16_us": 50.0,
                           "errors": {"int_mm": "RuntimeError: M must be > 16"}}],
            "peers": list(bench.PEERS), "targets": bench.evaluate_targets(SYNTH)}


def test_markdown():
    res = _results()
    md = bench.markdown(res)
    assert md.startswith("# opgen bench: NVIDIA H200")
    assert "`opgen bench --quick`" in md and "4.00 TB/s" in md and "800.0 TFLOP/s" in md
    table = bench.results_table(res["rows"]).splitlines()
    assert len(table) == 2 + len(res["rows"])
    assert table[0].startswith("| spec | N x K | M | opgen µs |")
    assert all(line.count("|") == table[0].count("|") for line in table)
    first = table[2]
    assert "gptq_v2_w4a16_g128" in first and "8192x8192" in first and "10.00" in first
    assert "| 5.00x | tinygemm int4 | 15.00 | 1.50x |" in first
    assert "WRONG" in table[4]                     # the row that failed its check
    assert "| err |" in table[-1]                  # mxfp4: opgen failed
    assert "## Targets (N = 8192, K = 8192)" in md
    # opgen µs, the slowest time that meets the target (50 / 4.5), no read-only time in SYNTH
    assert ("| W4A16 g128 M=1 vs cuBLAS fp16 | gptq_v2_w4a16_g128 | 1 | 5.00x | >= 4.5x | 10.00 | "
            "11.11 | — | met |") in md
    assert "| W2A16 M=1 within 1.4x of byte floor | w2a16_g128 | 1 | 1.40x floor | <= 1.4x |" in md
    assert "missed" in md and "## Problems" in md and "CompileError: boom" in md
    assert "## Peers" in md and "torch._int_mm: RuntimeError: M must be > 16" in md
    w8 = [r for r in res["rows"] if r["spec"] == "w8a8_int8" and r["M"] == 64][0]
    assert w8["linear_speedup_vs_bminf"] == 2.0
    assert "## Fused linear from fp16 activations" in md
    assert "| w8a8_int8 | 8192x8192 | 64 | 15.00 | 10.00 | 30.00 | 2.00x | ok |" in md
    assert bench.linear_table([r for r in res["rows"] if r["spec"] != "w8a8_int8"]) == ""


def test_write_outputs(tmp_path, capsys):
    res = _results()
    paths = bench.write_outputs(res, tmp_path / "out", plots=True)
    assert str(tmp_path / "out" / "bench.json") in paths
    back = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert back["rows"][0]["spec"] == "gptq_v2_w4a16_g128"
    assert (tmp_path / "out" / "bench.md").read_text() == bench.markdown(res)
    try:
        import matplotlib
        assert matplotlib
    except ImportError:
        assert "matplotlib not installed" in capsys.readouterr().err
        assert not any(p.endswith(".png") for p in paths)
    else:
        assert (tmp_path / "out" / "speedup.png").exists() and (tmp_path / "out" / "floor.png").exists()


# --- the tiled data and its check -------------------------------------------------

@pytest.mark.parametrize("name", bench.shipped_matmul_specs())
def test_tiled_problem_check(name):
    """The GPU side draws reference weights at N0 x K0 and tiles them; the
    shortcut reference of check_rows must equal the full reference of the
    tiled problem, and flag a wrong output."""
    s = spec(name)
    N, K, M = 512, 1024, 5
    N0, K0 = bench.base_shape(s, N, K, 256)
    assert (N0, K0) == (256, 256)
    rng = np.random.default_rng(3)
    w = random_weight_tensors(s, N0, K0, rng)
    want = bench.stored_shapes(s, N, K)
    big = {k: bench.tile_to(v, want[k]) for k, v in w.items()}
    a0, s0 = random_activation(s, M, K0, rng)
    full = reference_matmul_f32(s, bench.tile_to(a0, (M, K)), big, a_scale=s0)
    rows = bench.check_rows_of(M)
    assert list(rows) == [0, 1, 2, 3, 4]
    w_ref = dequantize(s, w, N0, K0).astype(np.float64)
    s_rows = None if s0 is None else s0[rows]
    ok = bench.check_rows(s, a0[rows], s_rows, w_ref, None, full[rows], N, K, N0, K0)
    assert ok["verified"] is True and ok["rel_err"] < 1e-6
    bad = full[rows].copy()
    bad[:, N0:] = 0                                   # second N tile unwritten
    assert bench.check_rows(s, a0[rows], s_rows, w_ref, None, bad, N, K, N0, K0)["verified"] is False
    nan = full[rows].copy()
    nan[0, 0] = np.nan
    assert bench.check_rows(s, a0[rows], s_rows, w_ref, None, nan, N, K, N0, K0)["verified"] is False


def test_tiled_rows():
    """Activations are drawn at M0 rows and tiled along M as well."""
    assert bench.base_rows(1) == 1 and bench.base_rows(256) == 256 and bench.base_rows(512) == 512
    assert bench.base_rows(4096) == 512 and bench.base_rows(1000) == 1000
    assert list(bench.check_rows_of(4096)) == [0, 1, 2, 3, 2048, 4095]
    assert list(bench.check_rows_of(1)) == [0]


def test_base_shape():
    s = spec("gptq_v2_w4a16_g128")
    assert bench.base_shape(s, 14336, 57344, limit=4096) == (2048, 4096)
    assert bench.base_shape(s, 8192, 8192, limit=4096) == (4096, 4096)
    assert bench.base_shape(s, 8192, 8192) == (2048, 2048)
    assert bench.base_shape(s, 28672, 8192) == (2048, 2048)
    # a base that breaks the spec's alignment (K0 = 64 < group 128): the full shape
    assert bench.base_shape(s, 4096, 4096 + 64, limit=4096) == (4096, 4096 + 64)
    with pytest.raises(ValueError):
        bench.tile_to(np.zeros((3, 4)), (4, 4))


# --- the GPU-side code driven with torch CPU tensors -------------------------------

class _FakeTimer:
    stream = contextlib.nullcontext()        # the cupy stream (a context manager)

    def measure(self, launch, budget_us=None, **kw):
        from opgen.runtime.timing import Timing
        for i in range(3):
            launch(i)
        return Timing(7.5, [7.5, 7.5, 7.5])


def _fake_gpu(monkeypatch, torch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    pool = types.SimpleNamespace(free_all_blocks=lambda: None)
    cp = types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(memGetInfo=lambda: (8 << 30, 16 << 30))),
        get_default_memory_pool=lambda: pool)
    g = object.__new__(bench._Gpu)
    g.torch, g.cp = torch, cp
    g.dev = torch.device("cpu")
    g.timer, g.tstream = _FakeTimer(), None
    g.l2, g.budget_us, g.mem_cap, g.seed, g.t0 = 1 << 20, 1000.0, 1 << 28, 0, time.time()
    g.base_limit = 256
    return g


class _FakeOp:
    """opgen.load stand-in: the numpy reference on torch CPU tensors."""

    def __init__(self, spec, N, K, wrong=False):
        self.spec, self.N, self.K, self.wrong = spec, N, K, wrong
        self.sources = {}
        self.calls = 0

    def kernel_for(self, M):
        from opgen.codegen.buckets import bucket_of
        self.sources[bucket_of(M)] = "heuristic"
        return types.SimpleNamespace(config=types.SimpleNamespace(name=f"fake_m{M}"))

    def __call__(self, a, qweight, scales=None, zeros=None, bias=None, a_scale=None, out=None):
        import torch

        def np_(t):
            if t is None:
                return None
            if t.dtype == torch.bfloat16:
                return t.view(torch.int16).numpy().view(np.uint16)
            return t.numpy()
        self.calls += 1
        tensors = {k: np_(v) for k, v in (("qweight", qweight), ("scales", scales), ("zeros", zeros))
                   if v is not None}
        ref = reference_matmul_f32(self.spec, np_(a), tensors, a_scale=np_(a_scale), bias=np_(bias))
        if self.wrong:
            ref = ref * 1.5
        out.copy_(torch.from_numpy(np.ascontiguousarray(ref)).to(out.dtype))
        return out


class _FakeLinear:
    """load_linear stand-in: reference quantization, then the fake op."""

    def __init__(self, op):
        self.op = op

    def __call__(self, x, qweight, scales=None, zeros=None, bias=None, out=None):
        import torch
        from opgen.codegen.reference import quantize_activation
        codes, sc = quantize_activation(self.op.spec, x.numpy())
        return self.op(torch.from_numpy(codes), qweight, scales, zeros, bias=bias,
                       a_scale=torch.from_numpy(sc), out=out)


@pytest.mark.parametrize("name", ["gptq_v2_w4a16_g128", "awq_w4a16_g128", "w8a8_int8",
                                  "fp8_e4m3_w8a8", "bitnet_b158", "mxfp4"])
def test_time_spec_with_torch_cpu(monkeypatch, name):
    torch = pytest.importorskip("torch")
    import opgen
    from opgen.runtime import op as op_mod
    g = _fake_gpu(monkeypatch, torch)
    s = spec(name)
    ops = []

    def load(sp, N, K, **kw):
        ops.append(_FakeOp(sp, N, K, wrong=(name == "mxfp4")))
        return ops[-1]
    monkeypatch.setattr(opgen, "load", load)
    monkeypatch.setattr(op_mod, "load_linear",
                        lambda sp, N, K, **kw: _FakeLinear(_FakeOp(sp, N, K)))
    Ms = [1, 6, 1024]                            # 1024: activations tiled along M too
    rows = g.time_spec(s, 512, 1024, Ms, db=None, use_db=False, verify=True)
    assert [r["M"] for r in rows] == Ms
    for r in rows:
        assert r.get("error") is None, r
        assert r["opgen_us"] == 7.5 and r["config"] == f"fake_m{r['M']}" and r["source"] == "heuristic"
        assert r["base_shape"] == [256, 256] and r["copies"] >= 2
        if name == "mxfp4":
            assert r["verified"] is False and "relative error" in r["verify_msg"]
        else:
            assert r["verified"] is True and r["rel_err"] < 1e-2
        if s.a.scale == "row":                   # opgen's fused linear from fp16 activations
            assert r["opgen_linear_us"] == 7.5 and r["linear_verified"] is True, r
        else:
            assert "opgen_linear_us" not in r and "opgen_linear_error" not in r
    assert ops[0].calls == len(Ms) * (1 + 3)     # one checked call + 3 timed launches, per M


def test_linear_failure_is_recorded(monkeypatch):
    torch = pytest.importorskip("torch")
    import opgen
    from opgen.runtime import op as op_mod
    g = _fake_gpu(monkeypatch, torch)
    monkeypatch.setattr(opgen, "load", lambda sp, N, K, **kw: _FakeOp(sp, N, K))

    def no_linear(*a, **k):
        raise RuntimeError("no quantize kernel")
    monkeypatch.setattr(op_mod, "load_linear", no_linear)
    s = spec("w8a8_int8")
    rows = g.time_spec(s, 256, 256, [32], db=None, use_db=False, verify=True)
    assert rows[0]["opgen_us"] == 7.5 and "no quantize kernel" in rows[0]["opgen_linear_error"]
    r = bench.finish_row(dict(rows[0], bminf_w8a8_us=20.0), s, MEAS)
    assert r["linear_speedup_vs_bminf"] is None
    md = bench.markdown({"rows": [r], "targets": []})
    assert "## Fused linear from fp16 activations" in md and "fused linear: RuntimeError" in md


def test_time_spec_setup_failure(monkeypatch):
    torch = pytest.importorskip("torch")
    import opgen
    g = _fake_gpu(monkeypatch, torch)

    def load(*a, **k):
        raise RuntimeError("no kernel today")
    monkeypatch.setattr(opgen, "load", load)
    rows = g.time_spec(spec("fp16"), 256, 256, [1, 16], db=None, use_db=False, verify=True)
    assert all(r["opgen_us"] is None and "no kernel today" in r["error"] for r in rows)


def test_time_peers_with_torch_cpu(monkeypatch):
    """Every peer yields a time or an error string, never an exception."""
    torch = pytest.importorskip("torch")
    g = _fake_gpu(monkeypatch, torch)
    out = g.time_peers(list(bench.PEERS), 256, 256, [1, 32])
    assert sorted(out) == [1, 32]
    for M, r in out.items():
        assert r["N"] == 256 and r["M"] == M
        for p in bench.PEERS:
            assert (r.get(f"{p}_us") is not None) != (p in r["errors"]), (p, r)
        assert r["cublas_fp16_us"] == 7.5


def test_measure_machine_with_torch_cpu(monkeypatch):
    torch = pytest.importorskip("torch")
    g = _fake_gpu(monkeypatch, torch)
    g._COPY_BYTES, g._PEAK_S = 1 << 16, 64
    m = g.measure_machine()
    assert m["copy_bytes"] == 2 << 16
    assert m["copy_tbps"] == pytest.approx((2 << 16) / 7.5 / 1e6, abs=1e-4)
    assert m["fp16_tflops"] == pytest.approx(2 * 64 ** 3 / 7.5 / 1e6, abs=0.01)
    # a ceiling torch cannot measure here is an error string, not an exception
    for k in ("int8", "fp8"):
        assert (f"{k}_error" in m) != any(x.startswith(k) and not x.endswith("error") for x in m)


def test_precompile_fills_the_cubin_cache(monkeypatch, tmp_path):
    """The background compile (spawned workers) leaves every kernel the op will
    pick in the cubin cache.  NVRTC needs no GPU; only the arch is faked."""
    pytest.importorskip("cupy")
    from opgen.runtime import device
    from opgen.codegen.compiler import cache_dir
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(device, "current_arch", lambda: "sm_90")
    g = object.__new__(bench._Gpu)
    g.t0 = time.time()
    specs = [spec("w4a16_sym_g128"), spec("w8a8_int8")]
    jobs = g._compile_jobs(specs, [(256, 512)], [1, 2, 64], None, False)
    assert len(jobs) == len({(j[0], j[1]) for j in jobs}) >= 3
    # w8a8: the quantize kernel of the fused linear as well
    assert [j[0].name for j in jobs if j[1] is None] == ["quantize_int8_float16"]
    assert all(len(j) == 3 and j[2] == "sm_90" for j in jobs)     # compile_many's jobs
    handle = g.start_precompile(specs, [(256, 512)], [1, 2, 64], None, False, workers=2)
    g.wait_precompile(handle)
    assert len(list(cache_dir().glob("*.cubin"))) == len(jobs)


def test_precompile_background_wait_and_cancel(monkeypatch):
    """start_precompile drives compiler.compile_many from a thread and returns
    at once; wait_precompile counts the failures (jobs never reported too);
    cancel returns at once and the thread closes compile_many after the
    job in flight."""
    import threading
    from opgen.codegen import compiler
    g = object.__new__(bench._Gpu)
    logs = []
    g.log = logs.append
    jobs = [("spec", i, "sm_90") for i in range(6)]
    g._compile_jobs = lambda *a: jobs
    release, closed = threading.Event(), []

    def many(js, workers, fail_after=None):
        assert js == jobs and workers == 3
        try:
            for k, j in enumerate(js):
                assert release.wait(10)
                if k == fail_after:
                    raise RuntimeError("pool broke")
                yield j, ("CompileError: x" if j[1] == 2 else None)
        finally:
            closed.append(True)

    monkeypatch.setattr(compiler, "compile_many", many)
    release.set()
    g.wait_precompile(g.start_precompile([], [], [], None, False, workers=3))
    assert "compiled 6 kernels" in logs[-1] and "(1 failed;" in logs[-1]

    monkeypatch.setattr(compiler, "compile_many", lambda js, w: many(js, w, fail_after=4))
    g.wait_precompile(g.start_precompile([], [], [], None, False, workers=3))
    assert "(3 failed;" in logs[-1]                  # job 2, and the two never reported

    monkeypatch.setattr(compiler, "compile_many", many)
    release.clear()
    closed.clear()
    handle = g.start_precompile([], [], [], None, False, workers=3)
    g.wait_precompile(handle, cancel=True)          # returns while the first job runs
    release.set()
    thread, _, state = handle[:3]
    thread.join(10)
    assert not thread.is_alive() and closed == [True] and state["done"] == 1


# --- run() with a fake GPU ----------------------------------------------------------

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
    monkeypatch.setattr(bench.runner, "_Gpu", _FakeGpuRun)
    monkeypatch.setattr(sys, "argv", ["opgen", "bench", "--quick", "--Ms", "1,64"])
    args = parse(["--quick", "--Ms", "1,64", "--no-db", "--no-plots", "--out", str(tmp_path)])
    assert bench.run(args) == 0
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["command"] == "opgen bench --quick --Ms 1,64"
    assert res["env"]["device"] == "FakeGPU" and res["measured"]["copy_tbps"] == 4.0
    assert len(res["rows"]) == 10 * 2 and len(res["peer_rows"]) == 2
    r = res["rows"][0]
    for key in ("spec", "N", "K", "M", "opgen_us", "config", "source", "bytes_floor_us",
                "flops_floor_us", "floor_us", "speedup_vs_cublas_fp16", "pct_of_floor",
                *[f"{p}_us" for p in bench.PEERS]):
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


@pytest.mark.gpu
def test_read_time_on_gpu():
    """The read-only kernel: no faster than HBM allows (5 TB/s is above any
    H100/H200 part), cached per size."""
    pytest.importorskip("torch")
    from opgen.runtime.device import has_gpu
    if not has_gpu():
        pytest.skip("needs an NVIDIA GPU")
    g = bench._Gpu(budget_ms=5, mem_cap=8 << 30)
    nbytes = 32 << 20
    t = g.read_time(nbytes)
    assert t is not None and nbytes / 5e6 < t < 1000.0
    assert g.read_time(nbytes - 4) == t           # same 16-byte words: from the cache
