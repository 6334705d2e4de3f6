"""runtime/tma.py on the CPU: which boxes the tensor maps ask for, and their
cache (the encoding itself needs the driver: the GPU tests run it)."""
from opgen.codegen import planner
from opgen.codegen.resolve import load_spec, shipped_specs
from opgen.runtime import tma


def spec(name):
    return load_spec(shipped_specs()[name])


def test_boxes_and_cache(monkeypatch):
    calls = []

    def fake_encode(ptr, rows, cols, elem_bytes, box_rows, box_cols, swizzle=tma._SWIZZLE_128B):
        calls.append((ptr, rows, cols, elem_bytes, box_rows, box_cols))
        assert swizzle == (tma._SWIZZLE_128B if elem_bytes == 2 else tma._SWIZZLE_NONE)
        return tma.TensorMap()

    monkeypatch.setattr(tma, "encode_2d", fake_encode)
    # The planner's boxes for a 128 x 256 tile in clusters of 2 (fp16).
    cfg = planner.Config("gemm", 128, 256, 64, 64, 256, 4, 1, wgmma=True, tma=True, cluster=2)
    boxes = planner.plan(spec("fp16"), cfg, "sm_90").tma
    assert boxes == planner.TmaBoxes(elem_bytes=2, box_a=(128, 64), box_b=(128, 64), cluster=2)
    maps = tma.TmaMaps(boxes)
    a = maps.a(0x1000, 300, 4096)
    assert maps.a(0x1000, 300, 4096) is a                  # cached per buffer and shape
    maps.b(0x2000, 8192, 4096)
    # A: one block's rows; B: each block of the cluster loads half the tile.
    assert calls == [(0x1000, 300, 4096, 2, 128, 64), (0x2000, 8192, 4096, 2, 128, 64)]
    maps.a(0x1000, 301, 4096)                              # another M: another map
    assert len(calls) == 3
    for i in range(tma.TmaMaps.LIMIT + 1):                 # bounded
        maps.a(0x10000 + 256 * i, 64, 4096)
    assert len(maps._maps) <= tma.TmaMaps.LIMIT
    # decoded weights: the stored words as 4-byte elements of their layout,
    # unswizzled boxes of the raw tile. w4a16_sym: bytes [N, K / 2] -> [8192, 512]
    # words, box 128 rows x 32 bytes; GPTQ: int32 [K / 8, N], box 8 rows x BN words.
    dec = planner.Config("gemm", 64, 128, 64, 64, 128, 4, 1, wgmma=True, tma=True)
    sym, gptq = (planner.plan(spec(n), dec, "sm_90").tma for n in ("w4a16_sym_g128", "gptq_v2_w4a16_g128"))
    assert (sym.box_b, gptq.box_b, sym.b_elem_bytes) == ((128, 8), (8, 128), 4)
    calls.clear()
    tma.TmaMaps(sym).b(0x3000, 8192, 4096)
    tma.TmaMaps(gptq).b(0x4000, 8192, 4096)
    assert calls == [(0x3000, 8192, 512, 4, 128, 8), (0x4000, 512, 8192, 4, 8, 128)]
