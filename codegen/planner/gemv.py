"""The GEMV family (gemv_row.cu.j2, gemv_int8.cu.j2, gemv_tc.cu.j2,
gemv_col.cu.j2): weights streamed once at small M, decoded in registers;
rows of activations staged in shared memory where the weights are stored
[N, K]. int8 activations with integer codes: the int8 GEMV (int_dot), int8
products summed in int32; other 8-bit activations staged as fp16 values,
code x a_scale[m] (registry.kernel_numerics)."""
from __future__ import annotations

from typing import Dict

from .. import hw
from ..lower import MAC_RUN, Layout, Numerics, Vector, decode_plan, gemv_mac, pair_table_ok, vector, weight_layout
from ..spec import INT_OUT_DTYPES, SUB_BYTE_INT_DTYPES, Spec
from .config import Config, PlanError
from .gemm import check_byte_lanes
from .launch import Axis, Family, GridRule, staged_smem

# The row GEMV stages its rows of activations in shared memory, [mmax, K / split_k]
# (16 KiB at M = 1, K = 8192); slices past this cap need split-K.
GEMV_SMEM_CAP = 64 << 10
# Live values per GEMV thread the planner allows (ptxas has 255 registers;
# the rest go to addresses, loop state and the decode's temporaries).
GEMV_REGS = 160


def int_dot(spec: Spec, cfg: Config) -> bool:
    """Whether cfg runs as the int8 GEMV (gemv_int8.cu.j2): int8 activations
    and integer weight codes (int8, or below 8 bits in byte lanes) on the SIMT
    row GEMV; each 4 codes meet 4 activations in one dp4a."""
    return (spec.a.dtype == "int8" and spec.b is not None and not cfg.tc
            and (spec.b.dtype == "int8" or spec.b.dtype in SUB_BYTE_INT_DTYPES))


def geometry(spec: Spec, cfg: Config, a: hw.Arch, num: Numerics, lay: Layout) -> Dict:
    """The SIMT GEMV (weights [N, K]: a warp per `cols` columns; [K, N]: a lane
    per weight vector of columns), its int8 form (int_dot) or the tensor-core
    one (Config.tc)."""
    if int_dot(spec, cfg):
        return _int8_geometry(cfg, a, num, lay)
    if spec.a.dtype not in ("float16", "bfloat16") and not num.a_staged_scale:
        raise PlanError("the GEMV family takes float16/bfloat16 activations, or 8-bit ones "
                        "with a row scale (staged as fp16 values)")
    if lay.row_axis == "n" and lay.row_div != 1:
        raise PlanError("GEMV needs nt weights packed along k")
    if num.a_staged_scale and lay.row_axis != "n":
        raise PlanError("8-bit activations are staged by the row GEMVs: weights stored [N, K]")
    vb = cfg.vbytes
    if vb % lay.elem_bytes or vb % 4:
        raise PlanError("vector bytes must hold whole words")
    # 4-bit codebooks: one table load per byte of codes (pairs of nibbles)
    pair_table = pair_table_ok(lay, num)
    vec = vector(lay, vb, byte_pairs=pair_table)
    if num.group and num.group % vec.k_extent:
        raise PlanError("weight vector crosses a scale group")
    scheme = "row" if lay.row_axis == "n" else "col"
    run = gemv_run(cfg, a, num, vec, scheme)
    if cfg.prefetch and (cfg.tc or lay.row_axis != "n"):
        raise PlanError("prefetch applies to the SIMT row GEMV (weights [N, K]; the "
                        "tensor-core one loads its first run early)")
    if scheme == "col":
        if cfg.tc:
            raise PlanError("the tensor-core GEMV takes weights stored [N, K]")
        if cfg.cols != 1:
            raise PlanError("columns per warp apply to the row GEMV (weights [N, K])")
        if vec.ncols % 2:
            raise PlanError("the column GEMV stores output pairs: a weight vector must span an "
                            "even number of columns n")
        # 16+ columns per lane (AWQ 8/16-byte vectors) take 240+ registers even at mmax 1.
        if cfg.mmax * vec.n_extent > 64 or vec.n_extent > 8:
            raise PlanError("too many accumulators per thread (mmax x vector width)")
    elif cfg.tc:
        _check_tc_gemv(cfg, num, vec)
    elif _row_gemv_regs(cfg, vec, run) > GEMV_REGS:
        raise PlanError(f"~{_row_gemv_regs(cfg, vec, run)} registers of live values per thread "
                        f"(limit {GEMV_REGS})")
    return dict(threads=cfg.warps * 32, scheme=scheme, vec=vec, dec=decode_plan(lay, num, pair_table),
                smem=GEMV_SMEM_CAP if scheme == "row" else 0, run=run, num_group=num.group,
                mac=gemv_mac(vec), mac_run=MAC_RUN)


def _int8_geometry(cfg: Config, a: hw.Arch, num: Numerics, lay: Layout) -> Dict:
    """The int8 GEMV: the row GEMV's warps, columns, runs and split-K, its
    staged activations int8 codes (plus each vector's code sum where a zero
    point is subtracted); each stored word's byte lanes masked in place and
    multiplied by dp4a into int32 sums (lane j's codes count 2^(j bits))."""
    if lay.row_axis != "n":
        raise PlanError("8-bit activations are staged by the row GEMVs: weights stored [N, K]")
    if num.out_dtype in INT_OUT_DTYPES and cfg.split_k > 1:
        raise PlanError("the int8 GEMV sums an int32 output's split-K slices nowhere (split_k 1)")
    dense = lay.bits == 8
    if not dense:
        check_byte_lanes(lay)
    vb = cfg.vbytes
    if vb % 4:
        raise PlanError("vector bytes must hold whole words")
    vec = vector(lay, vb)
    if num.group and num.group % vec.k_extent:
        raise PlanError("weight vector crosses a scale group")
    run = gemv_run(cfg, a, num, vec, "row", int8=True)
    if _int8_gemv_regs(cfg, vec, run) > GEMV_REGS:
        raise PlanError(f"~{_int8_gemv_regs(cfg, vec, run)} registers of live values per thread "
                        f"(limit {GEMV_REGS})")
    lanes = 1 if dense else lay.P // 4
    masks = [0xFFFFFFFF] if dense else [(((1 << lay.bits) - 1) << (j * lay.bits)) * 0x01010101
                                        for j in range(lanes)]
    dec = decode_plan(lay, num)
    zero_bias = 0 if dense else dec.sub_value
    return dict(threads=cfg.warps * 32, scheme="row", vec=vec, dec=dec, smem=GEMV_SMEM_CAP, run=run,
                num_group=num.group, int_dot=True, dense=dense, lanes=lanes, lane_masks=[f"0x{m:08X}" for m in masks],
                # Sign flip of two's complement codes (the top bit of lane j's field in
                # each byte; dec's is lane 0's): the codes become value + bias, which
                # zero_bias takes off with the zero point.
                lane_flips=[f"0x{int(dec.sign_flip_hex, 16) << (j * lay.bits):08X}" for j in range(lanes)]
                if dec.sign_flip_hex and not dense else [],
                zero_bias=zero_bias,
                # Each vector's activation code sum, staged after the codes: zero x sum is
                # what the zero point (and the codes' bias) takes off its dot product.
                act_sums=zero_bias != 0 or num.zero_kind == "int")


def _int8_gemv_regs(cfg: Config, vec: Vector, run: int) -> int:
    """Live values per thread of the int8 GEMV: a run of raw words with their
    scales and zeros (two runs with prefetch), one vector's activation words
    of every row, the sums (int32 or fp32) and one vector's lane sums."""
    buffers = 2 if cfg.prefetch else 1
    return (buffers * run * cfg.cols * (vec.words + 2) + cfg.mmax * vec.k_extent // 4
            + cfg.mmax * cfg.cols + 8)


def _check_tc_gemv(cfg: Config, num: Numerics, vec: Vector) -> None:
    """The tensor-core GEMV: a warp's 16 weight rows are the A operand of
    m16n8k16 (each quad of lanes holds 4 consecutive vectors of a row), the
    staged activations the B operand (one m16n8k16 per 8 rows of M, M <= 16);
    fp32 sums of raw (q - z) [or q, and of a, for q * s - z] are scaled once
    per k-block of 4 vectors, which must therefore lie in one scale group."""
    if cfg.cols != 1:
        raise PlanError("the tensor-core GEMV has 16 columns per warp (cols 1)")
    if cfg.mmax > 16:
        raise PlanError("the tensor-core GEMV takes at most 16 rows of activations")
    if vec.k_extent % 8:
        raise PlanError("the tensor-core GEMV needs 8+ weights per vector (one k16 step per quad)")
    if num.group and num.group % (4 * vec.k_extent):
        raise PlanError("a quad's 4 vectors must lie in one scale group")


def _row_gemv_regs(cfg: Config, vec: Vector, run: int) -> int:
    """Live values per thread of the row GEMV: a run of raw words with their
    scales and zeros (two runs with prefetch), the activation pairs of every
    row, one decoded vector, the accumulators (fp32 + fp16x2 slots)."""
    mac = gemv_mac(vec)
    buffers = 2 if cfg.prefetch else 1
    return (buffers * run * cfg.cols * (vec.words + 2) + cfg.mmax * len(mac.apairs)
            + len(vec.pairs) + cfg.mmax * cfg.cols * (1 + len(mac.slots)))


def gemv_run(cfg: Config, a: hw.Arch, num: Numerics, vec: Vector, scheme: str, int8: bool = False) -> int:
    """Vectors per thread per step (loaded together before any is decoded).
    Column scheme: consecutive rows inside one scale group, so the run shares
    one scale / zero load. Row scheme (int8: the int8 GEMV's): as long as the
    registers allow."""
    # mmax >= 4 keeps 4x the accumulators: half the run (gptq at mmax 4 spilled).
    # Prefetch: the two buffers together hold what one run holds without it.
    in_flight = hw.calibration(a.name).gemv_bytes_in_flight
    run = max(1, in_flight // (cfg.vbytes * cfg.cols) // (2 if cfg.mmax >= 4 else 1)
              // (2 if cfg.prefetch else 1))
    if scheme == "col" and num.group:
        while run > 1 and (num.group // vec.k_extent) % run:
            run //= 2
    if scheme == "row" and cfg.tc:
        # k-blocks in flight: two vectors each (rows g and g + 8), both decoded at once.
        return max(1, in_flight // (2 * cfg.vbytes))
    if scheme == "row":
        regs = _int8_gemv_regs if int8 else _row_gemv_regs
        while run > 1 and regs(cfg, vec, run) > GEMV_REGS:
            run //= 2
    return run


def shape_ok(g: Dict, cfg: Config, N: int, K: int) -> bool:
    """Whether the GEMV runs at N, K: whole k-blocks per slice, staged rows
    within the cap, runs that stay inside one scale group."""
    vec = g["vec"]
    if g["scheme"] == "row":
        blk = vec.k_extent * (4 if cfg.tc else 1) * cfg.split_k     # tc: k-blocks of 4 vectors
        if g.get("act_sums"):
            # The int8 GEMV's staged row: codes in whole 128-byte lines, then a
            # sum per vector, inside the row GEMVs' row (2 bytes an element).
            kslice = K // cfg.split_k
            if -(-kslice // 128) * 128 + 4 * (kslice // vec.k_extent) > -(-2 * kslice // 128) * 128:
                return False
        return K % blk == 0 and staged_smem(cfg.mmax, cfg.split_k, K) <= GEMV_SMEM_CAP
    if N % vec.n_extent or K % (vec.k_extent * cfg.split_k):
        return False
    # Runs stay inside one scale group only if every slice starts a group's run.
    return not g["num_group"] or (K // cfg.split_k) % (g["run"] * vec.k_extent) == 0


def grid(spec: Spec, cfg: Config) -> GridRule:
    """Blocks of output columns (`cols` columns per warp, 16 for the tensor-core
    one, when weights are [N, K]; one lane per weight vector when [K, N]) by
    split-K slices."""
    lay = weight_layout(spec)
    if lay.row_axis == "n":
        return GridRule(Axis("N", cfg.warps * (16 if cfg.tc else cfg.cols)), Axis("", cfg.split_k))
    return GridRule(Axis("N", 32 * vector(lay, cfg.vbytes).n_extent), Axis("", cfg.split_k))


def kind(cfg: Config, g: Dict) -> str:
    if cfg.tc:
        return "gemv_tc"
    return "gemv_int8" if g.get("int_dot") else f"gemv_{g['scheme']}"


FAMILY = Family("gemv", geometry, kind=kind, grid=grid, shape_ok=shape_ok,
                staged=lambda cfg, g: cfg.mmax if g["scheme"] == "row" else 0)
