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
    maps = tma.TmaMaps(elem_bytes=2, BM=128, BN=256, BK=64, cluster=2)
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
    # decoded weights: the stored 4-bit words as bytes [N, K / 2], unswizzled BN x 32-byte boxes
    calls.clear()
    stored = tma.TmaMaps(elem_bytes=2, BM=64, BN=128, BK=64, cluster=1, stored_bits=4, stored_rowb=32)
    stored.b(0x3000, 8192, 4096)
    assert calls == [(0x3000, 8192, 2048, 1, 128, 32)]
