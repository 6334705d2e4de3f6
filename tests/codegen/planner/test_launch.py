"""planner/launch.py: the typed launch plan -- the grid rule stated once (its
value and its plan.json text), shared memory per K, the TMA boxes."""
from opgen.codegen import planner
from opgen.codegen.resolve import load_spec, shipped_specs


def spec(name):
    return load_spec(shipped_specs()[name])


def test_grid_rule_value_and_text():
    rule = planner.GridRule(planner.Axis("N", 256), planner.Axis("M", 128, 2))
    assert rule(300, 1000) == (4, 4, 1) and rule(100, 1000) == (4, 2, 1)
    assert rule.text() == "[ceil(N/256), ceil(M/128) rounded up to a multiple of 2, 1]"
    split = planner.GridRule(planner.Axis("N", 128), planner.Axis("M", 16), planner.Axis("", 4))
    assert split(17, 4096) == (32, 2, 4) and split.text() == "[ceil(N/128), ceil(M/16), 4]"


def test_plans_state_each_family_grid():
    """What plan.json prints for each family, and that it is what launches."""
    s = spec("w4a16_sym_g128")
    cases = (
        (planner.Config("gemm", 128, 256, 64, 64, 256, 4, 1, wgmma=True, tma=True, cluster=2), "fp16",
         "[ceil(N/256), ceil(M/128) rounded up to a multiple of 2, 1]"),
        (planner.Config("gemm", 16, 128, 64, 16, 32, 4, 2), "w4a16_sym_g128", "[ceil(N/128), ceil(M/16), 2]"),
        (planner.DEQUANT, "w4a16_sym_g128", f"[ceil(N/128), {planner.DEQUANT_KSPLIT}, 1]"),
        (planner.Config("gemv", warps=8, vbytes=16, split_k=2, mmax=4, tc=True), "w4a16_sym_g128",
         "[ceil(N/128), 2, 1]"),
        (planner.Config("gemv", warps=8, vbytes=16, split_k=1, mmax=1, cols=4), "w4a16_sym_g128",
         "[ceil(N/32), 1, 1]"),
        (planner.Config("gemv", warps=4, vbytes=4, split_k=4, mmax=1), "awq_w4a16_g128",
         "[ceil(N/256), 4, 1]"),       # one lane per 4-byte vector of 8 columns
    )
    for cfg, name, text in cases:
        s = spec(name)
        p = planner.plan(s, cfg, "sm_90")
        assert p.grid.text() == text, cfg.name
        assert p.grid(300, 8192) == planner.grid(s, cfg, 300, 8192)


def test_shared_memory_per_launch():
    """Fixed per config, except the row GEMV's staged activation rows; the
    kernel opts in to the most it takes."""
    s = spec("w2a16_g128")
    cfg = planner.Config("gemv", warps=8, vbytes=16, split_k=1, mmax=1, cols=4)
    p = planner.plan(s, cfg, "sm_90")
    assert (p.kind, p.staged_rows, p.smem) == ("gemv_row", 1, 64 << 10)
    assert p.smem_at(8192) == 8192 * 2 and p.smem_at(8032) == 126 * 128
    g = planner.Config("gemm", 128, 256, 64, 64, 256, 4, 1, wgmma=True, tma=True)
    p = planner.plan(spec("fp16"), g, "sm_90")
    assert p.staged_rows == 0 and p.smem_at(8192) == p.smem == 4 * (128 + 256) * 128 + 1024


def test_tma_boxes():
    """Dense B: each block of a cluster loads its share of the tile's rows;
    stored words: the raw tile as 4-byte elements; A: one 128-byte swizzle
    atom of k per box."""
    tma = planner.Config("gemm", 128, 256, 128, 64, 256, 4, 1, wgmma=True, tma=True, cluster=2)
    b = planner.plan(spec("w8a8_int8"), tma, "sm_90").tma
    assert b == planner.TmaBoxes(1, (128, 128), (128, 128), 2) and b.b_elem_bytes == 1
    rs = planner.Config("gemm", 64, 64, 128, 64, 64, 8, 1, wgmma=True, tma=True, rs=True, kgroups=2)
    b = planner.plan(spec("w4a16_sym_g128"), rs, "sm_90").tma
    assert (b.box_a, b.box_b, b.b_elem_bytes) == ((64, 64), (64, 16), 4) and b.stored is not None
    assert planner.plan(spec("fp16"), planner.Config("gemm", 64, 128, 64, 64, 128, 4, 1, wgmma=True),
                        "sm_90").tma is None
