"""The copy paths of large values (the pool library's pool_copy.h): a put of
1 MiB or more streams into the pool with non-temporal stores, every part of a
multi-part value included (parts at any alignment); reads of 16 KiB or more
copy out with a vector loop. Sizes straddle both thresholds, destinations
and parts sit at odd offsets, and the bytes next to every destination must
stay untouched. One test reads the streamed values from another process."""
import numpy as np
import pytest

from conftest import connect, open_store

KIB, MIB = 1 << 10, 1 << 20
# Around the read threshold (16 KiB), the write threshold (1 MiB) and the
# put chunk (1 MiB), plus lengths that leave a tail shorter than a line.
SIZES = [16 * KIB - 1, 16 * KIB, 16 * KIB + 1, MIB - 1, MIB, MIB + 1, MIB + 63, 2 * MIB + 64 + 17, 3 * MIB + 5]
GUARD = 256


def pattern(size, seed):
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("offset", [0, 1, 40])
def test_put_get_and_get_into_at_odd_offsets(master, offset):
    s = connect(master)
    try:
        buf = np.full(max(SIZES) + 2 * GUARD + 64, 0xA5, dtype=np.uint8)
        assert s.register_buffer(buf.ctypes.data, buf.nbytes) == 0
        for i, size in enumerate(SIZES):
            v = pattern(size, i)
            key = f"lc/{offset}/{size}"
            assert s.put(key, v) == 0
            assert s.get(key) == v, size
            buf[:] = 0xA5
            at = GUARD + offset
            assert s.get_into(key, buf.ctypes.data + at, size) == size
            assert buf[at:at + size].tobytes() == v, size
            assert not (buf[:at] != 0xA5).any() and not (buf[at + size:] != 0xA5).any(), f"wrote outside ({size})"
        s.unregister_buffer(buf.ctypes.data)
    finally:
        s.close()


def back_to_back(base, sizes):
    """Addresses of slices of `sizes` laid out one right after the other from `base`."""
    ptrs = []
    for n in sizes:
        ptrs.append(base)
        base += n
    return ptrs


def test_multi_part_put_streams_every_part(master):
    # A tensor-like value: a 304-byte header, then parts whose pool offsets
    # are not line-aligned (the streaming copy must do heads and tails).
    s = connect(master)
    try:
        parts = [pattern(304, 1), pattern(MIB + 7, 2), pattern(33, 3), pattern(2 * MIB, 4), pattern(1, 5)]
        whole = b"".join(parts)
        src = np.frombuffer(bytearray(whole + b"\0" * 64), dtype=np.uint8)
        assert s.register_buffer(src.ctypes.data, src.nbytes) == 0
        sizes = [len(p) for p in parts]
        ptrs = back_to_back(src.ctypes.data, sizes)
        assert s.batch_put_from_multi_buffers(["mp/a"], [ptrs], [sizes]) == [0]
        assert s.get("mp/a") == whole
        # The same parts as a small value (below the streaming threshold).
        small = [parts[0], parts[2], parts[4]]
        sp = [src.ctypes.data, src.ctypes.data + 304 + MIB + 7, src.ctypes.data + len(whole) - 1]
        assert s.batch_put_from_multi_buffers(["mp/b"], [sp], [[len(p) for p in small]]) == [0]
        assert s.get("mp/b") == b"".join(small)
        s.unregister_buffer(src.ctypes.data)
    finally:
        s.close()


def test_batch_get_into_adjacent_odd_slices(master):
    s = connect(master)
    try:
        sizes = [16 * KIB + 3, 64 * KIB, 100 * KIB + 61, MIB + 1, 5]
        vals = [pattern(n, 10 + i) for i, n in enumerate(sizes)]
        keys = [f"bg/{i}" for i in range(len(sizes))]
        assert s.put_batch(keys, vals) == 0
        buf = np.full(sum(sizes) + GUARD * 2, 0x5A, dtype=np.uint8)
        assert s.register_buffer(buf.ctypes.data, buf.nbytes) == 0
        ptrs = back_to_back(buf.ctypes.data + GUARD + 1, sizes)  # every slice right after the previous one
        assert s.batch_get_into(keys, ptrs, sizes) == sizes
        got = buf[GUARD + 1:GUARD + 1 + sum(sizes)].tobytes()
        assert got == b"".join(vals)
        assert not (buf[:GUARD + 1] != 0x5A).any() and not (buf[GUARD + 1 + sum(sizes):] != 0x5A).any()
        s.unregister_buffer(buf.ctypes.data)
    finally:
        s.close()


def _read_back(conn, address, specs):
    s = open_store(address)
    try:
        bad = []
        for key, size, seed in specs:
            if s.get(key) != pattern(size, seed):
                bad.append(key)
        return bad
    finally:
        s.close()


def test_streamed_values_read_from_another_process(master, children):
    s = connect(master)
    try:
        specs = [(f"xp/{i}", n, 100 + i) for i, n in enumerate([MIB, 4 * MIB + 1, 2 * MIB + 33])]
        for key, size, seed in specs:
            assert s.put(key, pattern(size, seed)) == 0
        # An upsert of a streamed value: the reader sees the new bytes.
        assert s.upsert(specs[0][0], pattern(MIB, 999)) == 0
        specs[0] = (specs[0][0], MIB, 999)
        assert children(_read_back, master.address, specs).result() == []
    finally:
        s.close()
