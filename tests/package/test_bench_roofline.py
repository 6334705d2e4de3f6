"""What a matmul must cost at least (opgen/bench/roofline.py): bytes moved,
floors, each row's ratios."""
import numpy as np
import pytest

from bench_fakes import MEAS, spec
from opgen.bench import roofline
from opgen.bench.plan import shipped_matmul_specs
from opgen.codegen.random_data import random_activation, random_weight_tensors


def test_bytes_gptq_8192():
    N = K = 8192
    s = spec("gptq_v2_w4a16_g128")
    st = roofline.storage_bytes(s, N, K)
    assert st == {"qweight": N * K // 2, "scales": (K // 128) * N * 2, "zeros": (K // 128) * (N // 8) * 4}
    for M in (1, 16, 4096):
        assert roofline.bytes_moved(s, M, N, K) == (N * K // 2 + (K // 128) * N * 2
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
    assert sum(roofline.storage_bytes(s, N, K).values()) == weights(N, K)
    assert roofline.bytes_moved(s, 16, N, K) == weights(N, K) + 16 * K * 2 + 16 * N * 2


def test_bytes_w8a8_specs():
    N, K, M = 8192, 8192, 64
    # int8 weights + f32 channel scales, int8 a + f32 row scales, fp16 out
    assert roofline.bytes_moved(spec("w8a8_int8"), M, N, K) == N * K + 4 * N + M * K + 4 * M + 2 * M * N
    # fp8 the same, bf16 out
    assert roofline.bytes_moved(spec("fp8_e4m3_w8a8"), M, N, K) == N * K + 4 * N + M * K + 4 * M + 2 * M * N


@pytest.mark.parametrize("name", shipped_matmul_specs())
def test_bytes_match_the_reference_arrays(name):
    """storage_bytes = the nbytes of what random_weight_tensors makes (every spec)."""
    s = spec(name)
    N, K, M = 256, 512, 3
    w = random_weight_tensors(s, N, K, np.random.default_rng(0))
    assert roofline.storage_bytes(s, N, K) == {k: v.nbytes for k, v in w.items()}
    a, a_scale = random_activation(s, M, K, np.random.default_rng(1))
    out_b = {"float16": 2, "bfloat16": 2, "float32": 4, "int32": 4}[s.out.dtype]
    extra = 0 if a_scale is None else a_scale.nbytes
    assert roofline.bytes_moved(s, M, N, K) == sum(v.nbytes for v in w.values()) + a.nbytes + extra \
        + M * N * out_b


def test_floors_memory_and_compute_bound():
    s = spec("gptq_v2_w4a16_g128")
    N = K = 8192
    f1 = roofline.floors(s, 1, N, K, MEAS)
    assert f1["bound"] == "memory"
    assert f1["bytes_floor_us"] == pytest.approx(roofline.bytes_moved(s, 1, N, K) / 4e6, abs=1e-4)
    assert f1["flops_floor_us"] == pytest.approx(2 * N * K / 800e6, abs=1e-4)
    assert f1["floor_us"] == f1["bytes_floor_us"]
    f4k = roofline.floors(s, 4096, N, K, MEAS)
    assert f4k["bound"] == "compute"
    assert f4k["floor_us"] == pytest.approx(2 * 4096 * N * K / 800e6, rel=1e-6)
    # int8 / fp8 activations use their own ceilings; fp8 falls back to int8's
    assert roofline.floors(spec("w8a8_int8"), 4096, N, K, MEAS)["flops_floor_us"] == \
        pytest.approx(2 * 4096 * N * K / 1600e6, rel=1e-6)
    no_fp8 = {k: v for k, v in MEAS.items() if k != "fp8_tflops"}
    assert roofline.floors(spec("fp8_e4m3_w8a8"), 4096, N, K, no_fp8)["flops_floor_us"] == \
        pytest.approx(2 * 4096 * N * K / 1600e6, rel=1e-6)
    # nothing measured: no floor, no crash
    assert roofline.floors(s, 1, N, K, {})["floor_us"] is None


def test_finish_row():
    s = spec("gptq_v2_w4a16_g128")
    row = {"spec": s.name, "N": 8192, "K": 8192, "M": 1, "opgen_us": 10.0,
           "cublas_fp16_us": 45.0, "tinygemm_int4_us": 25.0}
    roofline.finish_row(row, s, MEAS)
    assert row["speedup_vs_cublas_fp16"] == 4.5
    assert row["relevant_peer"] == "tinygemm_int4" and row["speedup_vs_peer"] == 2.5
    assert row["pct_of_floor"] == pytest.approx(100 * row["floor_us"] / 10.0, abs=0.01)
    assert roofline.relevant_peer(spec("w8a8_int8")) == "int_mm"
    assert roofline.relevant_peer(spec("fp8_e4m3_w8a8")) == "scaled_mm"
    assert roofline.relevant_peer(spec("bnb_nf4")) is None
    failed = roofline.finish_row({"spec": "x", "N": 64, "K": 64, "M": 1, "opgen_us": None,
                               "cublas_fp16_us": 3.0}, s, MEAS)
    assert failed["speedup_vs_cublas_fp16"] is None and failed["pct_of_floor"] is None
