"""runtime/tma.py on the CPU: which boxes the tensor maps ask for, and their
cache (the encoding itself needs the driver: the GPU tests run it)."""
from opgen.runtime import tma


def test_boxes_and_cache(monkeypatch):
    calls = []

    def fake_encode(ptr, rows, cols, elem_bytes, box_rows, box_cols, swizzle=tma._SWIZZLE_128B):
        calls.append((ptr, rows, cols, elem_bytes, box_rows, box_cols))
        assert swizzle == (tma._SWIZZLE_128B if elem_bytes == 2 else tma._SWIZZLE_NONE)
        return tma.TensorMap()

    monkeypatch.setattr(tma, "encode_2d", fake_encode)
    maps = tma.TmaMaps(elem_bytes=2, box_a=(128, 64), BN=256, BK=64, cluster=2)
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
    from opgen.codegen.lower import weight_layout
    from opgen.codegen.validate import load_spec, shipped_specs
    sym, gptq = (weight_layout(load_spec(shipped_specs()[n])) for n in ("w4a16_sym_g128", "gptq_v2_w4a16_g128"))
    calls.clear()
    tma.TmaMaps(2, (64, 64), 128, 64, 1, stored=sym, stored_box=(128, 32)).b(0x3000, 8192, 4096)
    tma.TmaMaps(2, (64, 64), 128, 64, 1, stored=gptq, stored_box=(8, 512)).b(0x4000, 8192, 4096)
    assert calls == [(0x3000, 8192, 512, 4, 128, 8), (0x4000, 512, 8192, 4, 8, 128)]
