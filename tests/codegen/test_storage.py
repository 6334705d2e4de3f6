"""Stored weights (codegen/storage.py): codes <-> packed containers and
storage elements, both ways, for every weight format."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from opgen.codegen.random_data import random_codes
from opgen.codegen.reference import code_values
from opgen.codegen.spec import Pack, Weight, weight_storage_shape
from opgen.codegen.storage import decode_storage, encode_codes
from weight_strategies import SETTINGS, storage_dtype, weights


@settings(**SETTINGS)
@given(weights(), st.integers(0, 2**32 - 1))
def test_encode_decode_round_trip(wnk, seed):
    w, N, K = wnk
    rng = np.random.default_rng(seed)
    codes = random_codes(w, N, K, rng)
    qw = encode_codes(w, codes)
    assert qw.shape == weight_storage_shape(w, N, K)
    assert qw.dtype == storage_dtype(w)
    assert np.array_equal(decode_storage(w, qw), codes)
    # and storage -> codes -> storage is the identity too
    assert np.array_equal(encode_codes(w, decode_storage(w, qw)).view(np.uint8),
                          qw.view(np.uint8))


def test_pack_order_semantics():
    """Field i (field 0 = LSBs) of word j holds element j*P + order[i]."""
    w = Weight("uint4", "nt", Pack("uint8", "k", (1, 0)))
    codes = np.array([[0x1, 0x2, 0x3, 0x4]])
    assert encode_codes(w, codes).tolist() == [[0x12, 0x34]]
    w = Weight("uint2", "nn", Pack("int32", "n", (3, 2, 1, 0) + tuple(range(4, 16))))
    codes = np.zeros((16, 1), np.int64)
    codes[0, 0] = 3                                   # element 0 -> field 3 (bits 6..7)
    codes[15, 0] = 2                                  # element 15 -> field 15 (bits 30..31)
    qw = encode_codes(w, codes)
    assert qw.shape == (1, 1) and qw.dtype == np.int32
    assert int(qw.view(np.uint32)[0, 0]) == (3 << 6) | (2 << 30)


def test_unpacked_int_storage_holds_values():
    w = Weight("int8", "nn")
    codes = np.array([[0x80, 0xFF, 0x01]])            # raw fields: -128, -1, 1
    qw = encode_codes(w, codes)
    assert qw.dtype == np.int8 and qw[:, 0].tolist() == [-128, -1, 1]
    assert code_values(w, codes).tolist() == [[-128, -1, 1]]
    # signed values are accepted and masked to the same fields
    assert np.array_equal(encode_codes(w, np.array([[-128, -1, 1]])), qw)
