"""Render the CUDA source of a kernel from (spec, config, arch)."""
from __future__ import annotations

import functools
from importlib import resources

import jinja2

from . import hw, kernel_args, planner
from .lower import decode_plan, fold_zero, magic_split, weight_layout, zero_sub_bits
from .spec import WEIGHT_CODES, Spec

# Each kind of kernel and its template (one kernel per template).
TEMPLATES = {
    "gemm": "gemm.cu.j2",            # tensor-core GEMM: cp.async ring, mma.sync or wgmma
    "gemm_tma": "gemm_tma.cu.j2",    # warp-specialized GEMM: TMA ring, wgmma (Config.tma)
    "gemm_rs": "gemm_rs.cu.j2",      # rs GEMM: weights decoded into wgmma's register operand
    "gemv_row": "gemv_row.cu.j2",    # SIMT GEMV, weights stored [N, K]
    "gemv_int8": "gemv_int8.cu.j2",  # its int8 form: int8 activations, integer codes (dp4a)
    "gemv_tc": "gemv_tc.cu.j2",      # tensor-core GEMV, weights stored [N, K] (Config.tc)
    "gemv_col": "gemv_col.cu.j2",    # SIMT GEMV, weights stored [K, N]
    "dequant": "dequant.cu.j2",      # a predecode config's first stage
    "quantize": "quantize.cu.j2",    # op quantize
}
# The probes each kind has: named hooks, each taking one part of the kernel
# out (bench/ablate.py times what is left; the results are then wrong). Each
# is described in its template's header.
PROBES = {
    "gemm_rs": frozenset({"w_l2", "no_a", "no_w", "no_scales", "no_decode", "no_mma",
                          "lds_quarter", "no_lds", "spin"}),
    "gemv_row": frozenset({"no_mac", "no_stage"}),
}
# griddepcontrol (programmatic dependent launch) exists from sm_90.
PDL_MIN_CC = 90


def _template_text(name: str) -> str:
    return resources.files("opgen.templates").joinpath(name).read_text()


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_template_text),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    # Plain C++ headers are pasted verbatim (their asm braces are not Jinja).
    env.globals["raw"] = _template_text
    # Every kernel's signature: {{ kernel_name }}({{ kernel_params(ARGUMENTS) }}).
    env.globals.update(kernel_params=kernel_args.kernel_params, ARGUMENTS=kernel_args.ARGUMENTS,
                       TMA_ARGUMENTS=kernel_args.TMA_ARGUMENTS)
    return env


def kernel_name(spec: Spec, cfg: planner.Config) -> str:
    return f"opgen_{spec.name}_{cfg.name}"


def _probes(plan: planner.Launch) -> frozenset:
    """The probes of a planned kernel: its kind's (PROBES), none in the rs
    GEMM's int8 path (g.widen: its own decode and wgmma have no hooks)."""
    return frozenset() if plan.consts.get("widen") else PROBES.get(plan.kind, frozenset())


def kernel_probes(spec: Spec, cfg: planner.Config, arch: str) -> frozenset:
    """The probes the kernel of a single-kernel config has (_probes)."""
    return _probes(planner.plan(spec, cfg, arch))


def _zero_context(num) -> dict:
    """Packed integer zero points: code bits, mask, and the bit field that
    holds element j of a word (the inverse of the pack order)."""
    if num.zero_kind != "int":
        return dict(zero_bits=0, zero_inv=[], zero_mask=0, zero_inv_identity=True, zero_inv_packed=0)
    bits = WEIGHT_CODES[num.zero_dtype].bits
    inv = [0] * num.zero_P
    for field, elem in enumerate(num.zero_order):
        inv[elem] = field
    return dict(zero_bits=bits, zero_mask=(1 << bits) - 1, zero_inv=inv,
                zero_inv_identity=inv == list(range(num.zero_P)),
                zero_inv_packed=sum(f << (6 * j) for j, f in enumerate(inv)) if len(inv) <= 10 else 0)


def _magic_pair(dec, f16: bool, shift: int) -> dict:
    """The magic decode of the code pair at bit `shift` (see lower.magic_split):
    source shift t, mask at mantissa bit u, and x = h * scale - off."""
    t, u = magic_split(dec, shift, f16)
    mask2 = (dec.mask | dec.mask << 16) << u
    return dict(t=t, u=u, mask2_hex=f"0x{mask2:08X}", scale=repr(2.0 ** -u),
                off=repr(dec.magic_base / 2 ** u + dec.sub_value - dec.magic_base))


def pdl_available(arch: str) -> bool:
    """Whether arch has programmatic dependent launch (griddepcontrol)."""
    return hw.arch(arch).cc >= PDL_MIN_CC


def _check_pdl(pdl: bool, arch: str) -> None:
    if pdl and not pdl_available(arch):
        raise ValueError(f"pdl: griddepcontrol needs sm_{PDL_MIN_CC}+, not {arch}")


def render(spec: Spec, cfg: planner.Config, arch: str, probes: frozenset = frozenset(),
           plan: planner.Launch | None = None, pdl: bool = False) -> tuple[str, dict]:
    """CUDA source and the template constants (the plan's consts) of a
    single-kernel config (a predecode config renders as its planner.stages),
    from its launch plan (planner.plan, unless given). probes: the kernel
    with those parts taken out (PROBES; a probe its kind does not have is an
    error); none: the kernel that ships. pdl: the kernel for a programmatic
    dependent launch (templates/pdl.cuh; runtime/pdl.py launches it): it
    lets the next kernel start early and waits for the previous one before
    it reads the activations or writes; false renders the kernel unchanged."""
    _check_pdl(pdl, arch)
    plan = plan or planner.plan(spec, cfg, arch)
    g, kind = plan.consts, plan.kind
    have = _probes(plan)
    unknown = set(probes) - have
    if unknown:
        raise ValueError(f"the {kind} kernel has no probe {', '.join(sorted(unknown))} "
                         f"(it has: {', '.join(sorted(have)) or 'none'})")
    num = planner.kernel_numerics(spec, cfg, arch)
    lay = weight_layout(spec)
    dec = g.get("dec") or decode_plan(lay, num)     # the GEMV may pair codes by byte
    zc = _zero_context(num)
    ctx = dict(
        spec_name=spec.name, kernel_name=kernel_name(spec, cfg), c=cfg, g=g, num=num, lay=lay,
        dec=dec, vec=g.get("vec"),
        # Channel / tensor scales of 8-bit products (dense or widened codes) go
        # to the epilogue; group scales of widened codes to gemm.cu.j2's flush.
        epi_wscale=(num.dense or num.widen) and num.scale_gran in ("channel", "tensor"),
        magic_pair=functools.partial(_magic_pair, dec, num.compute_t == "half"),
        zero_fold=fold_zero(num, dec, zc["zero_bits"]),
        zero_sub=zero_sub_bits(num, dec, zc["zero_bits"]),
        probes=frozenset(probes), pdl=pdl, **zc,
    )
    src = _env().get_template(TEMPLATES[kind]).render(**ctx)
    return src, g


def render_quantize(spec: Spec, arch: str, threads: int = 256, pdl: bool = False) -> tuple[str, dict]:
    """op quantize: per-row absmax -> int8 / fp8 e4m3 codes + float32 scales
    (pdl: render's)."""
    _check_pdl(pdl, arch)
    name = f"opgen_{spec.name}"
    ctx = dict(kernel_name=name, threads=threads, out_dtype=spec.out.dtype, pdl=pdl,
               in_t="half" if spec.a.dtype == "float16" else "__nv_bfloat16",
               code_t="int8_t" if spec.out.dtype == "int8" else "uint8_t",
               qmax="127.0" if spec.out.dtype == "int8" else "448.0")
    return _env().get_template(TEMPLATES["quantize"]).render(**ctx), dict(name=name, threads=threads, smem=0)
