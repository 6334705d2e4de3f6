"""The M buckets (codegen/buckets.py): boundaries, representative Ms, speed."""
import time

import pytest

from opgen.codegen.buckets import BUCKETS, LABELS, bucket_of, representative_M


def test_bucket_boundaries():
    assert bucket_of(1) == "1"
    for lo, hi, label in BUCKETS:
        assert bucket_of(lo) == label
        if hi is not None:
            assert bucket_of(hi) == label
            assert bucket_of(hi + 1) != label
        assert bucket_of(representative_M(label)) == label
    assert bucket_of(1024) == "513-1024" and bucket_of(1025) == ">1024"
    assert bucket_of(10 ** 6) == ">1024"
    assert [representative_M(b) for b in LABELS] == [1, 4, 8, 16, 32, 64, 128, 256, 512, 1024,
                                                    4096]
    for bad in (0, -1):
        with pytest.raises(ValueError):
            bucket_of(bad)
    for bad in ("8", 8.0, True, None):
        with pytest.raises(TypeError, match="M must be a positive int"):
            bucket_of(bad)
    with pytest.raises(ValueError):
        representative_M("3-7")


def test_bucket_of_is_fast():
    t0 = time.perf_counter()
    for m in range(1, 100_001):
        bucket_of(m & 1023 or 1)
    assert time.perf_counter() - t0 < 0.2
