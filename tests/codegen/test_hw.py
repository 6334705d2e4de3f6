"""Hardware facts and calibration as data (codegen/hw.py): each arch's facts
agree with each other and with the MMA tables, every arch is planned for a
device that exists and has a calibration, and the calibration covers every
tile the planner can plan."""
import re

import pytest

from opgen.codegen import hw, planner
from opgen.codegen.resolve import as_spec


@pytest.mark.parametrize("name", sorted(hw.ARCHS))
def test_arch_facts_agree(name):
    a = hw.ARCHS[name]
    assert a.name == name and name == f"sm_{a.cc}"
    assert hw.arch(name) is a
    assert 48 * 1024 <= a.smem_per_block <= a.smem_per_sm
    assert a.regs_per_sm == 65536 and a.max_threads_per_sm >= hw.MAX_THREADS_PER_BLOCK
    # fp8 mma.sync exists from the cc the e4m3 MMA names
    assert a.fp8_mma == (a.cc >= hw.MMAS["float8_e4m3"].min_cc)
    # wgmma and TMA come together (sm_90a), compiled for the arch-specific target
    assert a.wgmma == a.tma == (name in hw.WGMMA_TARGET)
    assert all(m.min_cc <= a.cc for d, m in hw.MMAS.items() if d != "float8_e4m3")


def test_mma_shapes_take_32_bytes_of_k():
    """mma.sync's k and wgmma's k step are 32 bytes of K for every operand
    type, and the instruction says the shape and types it runs."""
    assert set(hw.MMAS) == set(hw.WGMMAS)
    for dtype, m in hw.MMAS.items():
        assert m.k * m.a_bytes == 32 and (m.m, m.n) == (16, 8)
        assert f".m{m.m}n{m.n}k{m.k}." in m.ptx and m.ptx.startswith("mma.sync.aligned.")
        assert m.acc == ("s32" if dtype == "int8" else "f32") and f".{m.acc}." in m.ptx
        w = hw.WGMMAS[dtype]
        assert w.k == m.k and w.types.startswith(m.acc + ".")


def test_arch_lookups():
    with pytest.raises(ValueError, match=rf"unknown arch 'sm_75' \(allowed: {', '.join(hw.ARCHS)}\)"):
        hw.arch("sm_75")
    assert hw.arch_from_cc(9, 0).name == "sm_90"
    assert hw.arch_from_cc(8, 7).name == "sm_86"       # the closest known at or below
    assert hw.arch_from_cc(12, 0).name == "sm_90"
    with pytest.raises(ValueError, match="too old"):
        hw.arch_from_cc(7, 5)


def test_launch_reg_cap():
    """ptxas's cap under __launch_bounds__(threads, 1): the register file
    over whole warpgroups, in steps of 8 (288 threads -> 168, measured)."""
    a = hw.arch("sm_90")
    assert a.launch_reg_cap(288) == 168
    assert a.launch_reg_cap(128) == hw.MAX_REGS_PER_THREAD
    for threads in range(32, hw.MAX_THREADS_PER_BLOCK + 1, 32):
        cap = a.launch_reg_cap(threads)
        assert cap % 8 == 0 or cap == hw.MAX_REGS_PER_THREAD
        assert cap * -(-threads // 128) * 128 <= a.regs_per_sm


@pytest.mark.parametrize("name", sorted(hw.ARCHS))
def test_every_arch_is_planned_for_a_known_device(name):
    assert set(hw.PLANNED_DEVICE) == set(hw.ARCHS)
    d = hw.planned_device(name)
    assert hw.DEVICES[d.name] is d and d.arch in hw.ARCHS and d.sms > 0
    assert hw.calibration(name) is hw.CALIBRATION[d.name]


def test_unknown_arch_has_no_planned_device():
    with pytest.raises(ValueError, match="unknown arch 'sm_70'"):
        hw.planned_device("sm_70")


@pytest.mark.parametrize("device", sorted(hw.CALIBRATION))
def test_calibration_is_complete(device):
    cal = hw.CALIBRATION[device]
    assert set(cal.predecode_m) == {"no_fused_wgmma", "zero_points", "other", "rs_gemm", "widened_a8",
                                     "rs_widened_a8"}
    assert set(cal.rs_predecode_m_of) <= cal.rs_verified
    assert all(m > 0 for m in cal.predecode_m.values())
    # the two decodes run on the device cover every (BK, BM) the rs GEMM has
    assert set(cal.rs_regs["magic/halves"]) == set(cal.rs_regs["magic_int_zero/halves"])
    assert {(bk, bm) for bk in planner.RS_TILES_K for bm in planner.RS_TILES_M} \
        - set(cal.rs_regs["magic/halves"]) == {(128, 256)}          # (does not fit)
    for table in cal.rs_regs.values():
        assert all(0 < r <= hw.MAX_REGS_PER_THREAD for r in table.values())
    # what the heuristic may pick was run on the device, and has a table
    assert {k.rsplit("/", 1)[0] for k in cal.rs_verified} <= set(cal.rs_regs)
    assert all(k.split("/")[1] in ("halves", "pairs", "bytes") for k in cal.rs_regs)
    assert max(cal.tma_tile_speed.values()) == 1.0 and min(cal.tma_tile_speed.values()) > 0
    # every TMA GEMM tile the planner may time has a measured speed (the heuristic's score)
    tma_tiles = {(c.BM, c.BN) for c in planner.all_configs() if c.tma and not c.rs}
    assert tma_tiles <= set(cal.tma_tile_speed)


@pytest.mark.parametrize("name", ["w4a16_sym_g128", "gptq_v2_w4a16_g128_repacked", "bnb_nf4", "bitnet_b158",
                                  "w2a16_g128"])
def test_rs_register_tables_cover_every_rs_tile_that_fits(name):
    """An rs GEMM config is either refused with its reason or finds its
    (BK, BM) in the register table of its decode (rs_regs): some config of
    each of these specs plans."""
    s = as_spec(name)
    planned = 0
    for c in planner.all_configs():
        if not c.rs:
            continue
        try:
            planner.geometry(s, c, "sm_90")
        except planner.PlanError:
            continue
        planned += 1
    assert planned > 0


def test_each_measured_constant_cites_its_evidence():
    """Every measured constant of hw.py names its source in
    docs/performance.md (by section), never a run folder."""
    text = open(hw.__file__).read()
    cal = text[text.index("H200 = Calibration("):]
    fields = re.findall(r"^    (\w+)=", cal, re.M)
    assert set(fields) == {"gemv_bytes_in_flight", "tma_tile_speed", "predecode_m", "rs_regs",
                           "rs_verified", "rs_decode_rows", "rs_staging_rows", "rs_from_m9", "rs_from_m9_fill", "rs_from_m9_fill_of",
                           "rs_from_m9_short_k_fill_of", "rs_from_m9_short_k",
                           "gemv_split_fill_warps", "rs_min_fill", "rs_rows64_max_m", "rs_pair_tables_128_deep",
                           "rs_predecode_m_of", "rs_shallow_rings",
                           "rs_decode_rows_of", "rs_deep_kgroups",
                           "gemv_no_prefetch", "tc_gemv_min_codes", "tc_gemv_eight_warps", "int8_gemv_max_m", "a8_gemv_max_m", "a8_verified",
                           "inflight_sums_verified", "rs_pair_tables", "widened_waves_max_m",
                           "widened_decode_rows"}
    assert cal.count("Source: docs/performance.md#") >= len(fields)
    assert not re.search(r"run\d+|NOTES|bench/results", text)
