"""bench/ablate.py on the CPU: its variants are edits of template text, so a
template change can make one stop applying; it would then silently time
nothing. Every variant must apply to the kernels it was written for, and the
swapped GEMM's edits must not apply to the GEMV (nor the GEMV's to it)."""
import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "ablate.py"
_spec = importlib.util.spec_from_file_location("ablate", _PATH)
ablate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ablate)

ARCH = "sm_90"
RS = ("w4a16_sym_g128", "gemm_16x64x128_w64x16_p12_s1_wg_tma_rs4", 16, 8192, 8192)
RS_GPTQ = ("gptq_v2_w4a16_g128_repacked", "gemm_256x64x64_w64x256_p4_s1_wg_tma_rs2", 256, 8192, 8192)
GEMV = ("w4a16_sym_g128", "gemv_m1_w4_c4_v16_s1", 1, 8192, 8192)
GEMV_PF = ("bnb_nf4", "gemv_m1_w8_c4_v16_s1_pf", 1, 8192, 8192)


@pytest.mark.parametrize("variant", sorted(ablate.VARIANTS))
def test_every_variant_applies_where_it_is_meant_to(variant):
    edits = ablate.VARIANTS[variant]
    gemv = variant.startswith("gemv_")
    if variant == "as_is":
        targets, others = [RS, GEMV], []
    else:
        targets, others = ([GEMV, GEMV_PF], [RS]) if gemv else ([RS, RS_GPTQ], [GEMV])
    for t in targets:
        assert ablate._applies(edits, ablate._source(*t, ARCH)), (variant, t[1])
    for t in others:
        assert not ablate._applies(edits, ablate._source(*t, ARCH)), (variant, t[1])


def test_patched_render_edits_and_refuses_what_does_not_apply():
    from opgen.codegen import render
    spec, cfg = ablate._config(*RS, ARCH)
    src, _ = render.render(spec, cfg, ARCH)
    patched, _ = ablate._patched_render(ablate.VARIANTS["no_mma"])(spec, cfg, ARCH)
    assert patched != src and "if (M < 0) wgmma_rs(acc, frag[ks], " in patched
    gspec, gcfg = ablate._config(*GEMV, ARCH)
    with pytest.raises(RuntimeError, match="does not apply"):
        ablate._patched_render(ablate.VARIANTS["no_mma"])(gspec, gcfg, ARCH)
