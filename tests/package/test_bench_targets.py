"""The performance targets' evaluation against result rows
(opgen/bench/targets.py; on a GPU, tests/perf/ holds opgen to them)."""
from bench_fakes import SYNTH, find
from opgen.bench.targets import evaluate_targets


def test_evaluate_targets():
    t = evaluate_targets(SYNTH)
    m1 = find(t, "W4A16 g128 M=1 vs cuBLAS fp16", "gptq_v2_w4a16_g128")
    assert m1["status"] == "met" and m1["ratio"] == 5.0 and m1["need"] == 4.5
    assert find(t, "W4A16 g128 M=1 vs cuBLAS fp16", "w4a16_sym_g128")["status"] == "missed"   # 4.0x
    tg = find(t, "W4A16 g128 M=1 vs tinygemm", "gptq_v2_w4a16_g128")
    assert tg["status"] == "missed" and tg["ratio"] == 1.5
    assert find(t, "W4A16 g128 M=1 vs tinygemm", "w4a16_sym_g128")["status"] == "met"
    assert find(t, "W4A16 g128 M=16 vs cuBLAS fp16")["status"] == "missed"       # 3.3 < 3.4
    assert find(t, "W4A16 g128 M=4096 vs cuBLAS fp16")["status"] == "met"        # 0.8 >= 0.8
    assert find(t, "W4A16 g128 M=64 vs cuBLAS fp16")["status"] == "not measured"
    w2 = find(t, "W2A16 M=1 within 1.4x of byte floor")
    assert w2["status"] == "met" and w2["ratio"] == 1.4 and w2["op"] == "<="
    assert find(t, "NF4 M=1 within 1.5x of byte floor")["status"] == "missed"    # 2.0x
    mx = find(t, "MXFP4 M=1 within 1.5x of byte floor")
    assert mx["status"] == "n/a" and "boom" in mx["why"]
    assert find(t, "W1A16 M=1 within 1.4x of byte floor")["status"] == "not measured"
    w8 = [x for x in t if x["target"].startswith("W8A8")]
    assert [(x["M"], x["status"]) for x in w8] == [(64, "missed"), (256, "met")]
    fp8 = find(t, "FP8 >= 0.9x torch._scaled_mm, M >= 256")
    assert fp8["status"] == "n/a" and "not supported" in fp8["why"]
    # every entry is at N = K = 8192
    assert {(x["N"], x["K"]) for x in t} == {(8192, 8192)}
