"""The parsed-header cache of mooncake_cxl.tensor_codec (parse_meta): a hit is the
answer a full parse gives for the same header bytes and object length, and
anything else (another length, one byte changed) is parsed and checked again."""
import pytest

torch = pytest.importorskip("torch")

from mooncake_cxl import tensor_codec as T  # noqa: E402


def _object(t):
    parts = T.tensor_parts(t.contiguous(), "test", "k", t.shape, [])
    return bytes(parts.meta)


def test_cache_hit_equals_a_full_parse_and_other_lengths_are_rechecked():
    T._META_CACHE.clear()
    head = _object(torch.arange(12, dtype=torch.float32).reshape(3, 4))
    total = T.HEADER_SIZE + 48
    m1, why1 = T.parse_meta(head, total)
    m2, why2 = T.parse_meta(bytearray(head), total)  # any buffer type, same key
    full, _ = T._parse_meta(head, total)
    assert m1 is not None and m2 is m1 and why1 == why2 == ""
    for f in TensorMetaFields:
        assert getattr(m1, f) == getattr(full, f)
    # Same header bytes, wrong object length: not a hit, refused as before.
    m3, why3 = T.parse_meta(head, total + 4)
    assert m3 is None and "do not match" in why3
    # One byte of the magic changed: parsed again and refused.
    bad = b"\x00" + head[1:]
    m4, why4 = T.parse_meta(bad, total)
    assert m4 is None and "not a tensor object" in why4
    assert (bad, total) not in T._META_CACHE


TensorMetaFields = ("dtype", "ndim", "layout_kind", "data_offset", "data_bytes", "global_shape",
                    "local_shape", "axes")


def test_cache_is_bounded():
    T._META_CACHE.clear()
    for n in range(1, T._META_CACHE_MAX + 50):
        head = _object(torch.zeros(n, dtype=torch.uint8))
        m, _ = T.parse_meta(head, T.HEADER_SIZE + n)
        assert m is not None and m.local_shape == [n]
    assert len(T._META_CACHE) <= T._META_CACHE_MAX
