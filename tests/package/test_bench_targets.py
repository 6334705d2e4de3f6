"""The performance targets' evaluation against result rows
(opgen/bench/targets.py; on a GPU, tests/perf/ holds opgen to them): the
isolated ones on opgen_us, the graph-mode ones on opgen_graph_us (or the
PDL launch's, where faster)."""
from bench_fakes import SYNTH, find, row
from opgen.bench.targets import GRAPH_SHAPES, TARGETS, evaluate_targets


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
    # every isolated entry is at N = K = 8192; SYNTH has no graph figures
    assert {(x["N"], x["K"]) for x in t if x["mode"] == "isolated"} == {(8192, 8192)}
    graph = [x for x in t if x["mode"] == "graph"]
    assert graph and all(x["status"] in ("n/a", "not measured") for x in graph)
    nf4 = find(t, "graph: W4A16 g128, NF4, MXFP4 M=1 within 1.2x of byte floor", "bnb_nf4")
    assert nf4["status"] == "n/a" and nf4["why"] == "graph mode not run (--no-graph)"
    mx = find(t, "graph: W4A16 g128, NF4, MXFP4 M=1 within 1.2x of byte floor", "mxfp4")
    assert "opgen failed: CompileError: boom" in mx["why"]


GRAPH_ROWS = [
    # 8192 x 8192: W4A16 at 1.1x its floor (met), NF4 at 1.3x (missed)
    row("w4a16_sym_g128", 1, 15.5, opgen_graph_us=9.35, bytes_floor_us=8.5, graph_layers=16),
    row("bnb_nf4", 1, 18.0, opgen_graph_us=13.0, bytes_floor_us=10.0, graph_layers=16),
    row("w2a16_g128", 1, 13.0, opgen_graph_us=7.0, bytes_floor_us=5.0, graph_layers=25),
    row("w2a16_g128", 16, 14.0, opgen_graph_us=7.0, bytes_floor_us=5.0, graph_layers=25),
    row("mxfp4", 1, 17.0, graph_error="capture: CUDARuntimeError: capture invalidated"),
    row("w8a8_int8", 1, 9.0, opgen_graph_us=8.0, bytes_floor_us=1.0),   # not a graph format
    # 28672 x 8192: the graph targets' second shape
    row("w4a16_sym_g128", 1, 40.0, N=28672, opgen_graph_us=36.0, bytes_floor_us=30.0),
]


def test_graph_targets():
    """The graph-mode targets of issue 28 on the per-layer figure, at both
    shapes; the isolated targets never read it."""
    t = evaluate_targets(GRAPH_ROWS)
    w4 = "graph: W4A16 g128, NF4, MXFP4 M=1 within 1.2x of byte floor"
    sq = [x for x in t if x["target"] == w4 and x["spec"] == "w4a16_sym_g128"]
    assert [(x["N"], x["K"]) for x in sq] == list(GRAPH_SHAPES)
    a, b = sq
    assert a["status"] == "met" and a["ratio"] == 1.1 and a["mode"] == "graph"
    assert a["opgen_graph_us"] == 9.35 and a["opgen_us"] == 15.5 and a["graph_layers"] == 16
    assert a["needed_us"] == 10.2 and a["bytes_floor_us"] == 8.5     # 1.2 x the floor
    assert b["status"] == "met" and b["ratio"] == 1.2                # 36 / 30: at the limit
    assert find(t, w4, "bnb_nf4", M=1)["status"] == "missed"
    mx = find(t, w4, "mxfp4", M=1)
    assert mx["status"] == "n/a" and mx["why"].startswith("graph mode failed: capture:")
    low = "graph: W2A16, W1A16, ternary M=1 within 1.5x of byte floor"
    assert find(t, low, "w2a16_g128", M=1)["status"] == "met"          # 1.4x
    m16 = find(t, "graph: M=16 within 1.5x of byte floor", "w2a16_g128", M=16)
    assert m16["status"] == "met" and m16["ratio"] == 1.4
    assert not any(x["spec"] == "w8a8_int8" for x in t if x["mode"] == "graph")
    # the isolated W2A16 target stays on the isolated figure: 13 / 5 = 2.6x
    iso = find(t, "W2A16 M=1 within 1.4x of byte floor")
    assert iso["status"] == "missed" and iso["ratio"] == 2.6 and "opgen_graph_us" not in iso
    # every graph target is held at both shapes, every isolated one at 8192 x 8192
    for target in TARGETS:
        assert target.shapes == (GRAPH_SHAPES if target.graph else ((8192, 8192),))
    # an explicit shape still applies to every target
    assert {(x["N"], x["K"]) for x in evaluate_targets(GRAPH_ROWS, shape=(28672, 8192))} == {
        (28672, 8192)}


def test_graph_targets_hold_the_faster_launch():
    """With PDL timed too, a graph target holds the faster of the two
    per-layer figures and says which; a PDL figure whose check failed never
    counts; PDL alone stands in where the plain graph failed."""
    w4 = "graph: W4A16 g128, NF4, MXFP4 M=1 within 1.2x of byte floor"
    rows = [row("w4a16_sym_g128", 1, 15.5, opgen_graph_us=11.0, opgen_graph_pdl_us=9.35,
                graph_pdl_verified=True, bytes_floor_us=8.5, graph_layers=16),
            row("bnb_nf4", 1, 18.0, opgen_graph_us=13.0, opgen_graph_pdl_us=9.0,
                graph_pdl_verified=False, bytes_floor_us=10.0),
            row("mxfp4", 1, 17.0, graph_error="capture: boom", opgen_graph_pdl_us=11.0,
                bytes_floor_us=10.0),
            row("awq_w4a16_g128", 1, 16.0, opgen_graph_us=9.0, opgen_graph_pdl_us=9.5,
                bytes_floor_us=8.0)]
    t = evaluate_targets(rows, shape=(8192, 8192))
    a = find(t, w4, "w4a16_sym_g128", M=1)
    assert a["status"] == "met" and a["ratio"] == 1.1 and a["opgen_graph_us"] == 9.35
    assert a["graph_launch"] == "pdl"
    nf4 = find(t, w4, "bnb_nf4", M=1)
    assert nf4["opgen_graph_us"] == 13.0 and nf4["graph_launch"] == "plain"
    mx = find(t, w4, "mxfp4", M=1)
    assert mx["status"] == "met" and mx["graph_launch"] == "pdl"
    awq = find(t, w4, "awq_w4a16_g128", M=1)
    assert awq["opgen_graph_us"] == 9.0 and awq["graph_launch"] == "plain"
