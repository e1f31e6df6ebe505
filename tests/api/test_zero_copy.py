"""Zero-copy calls against the contract: register_buffer, put_from/get_into and
their batch and multi-buffer forms, get_into_ranges, put_from_with_metadata,
get_buffer / BufferHandle pins."""
import gc

import numpy as np
import pytest

from mooncake_cxl import BufferHandle, ErrorCode

OK = 0
INVALID = ErrorCode.INVALID_PARAMS


def _buf(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_register_and_unregister(store):
    a = np.zeros(1 << 20, dtype=np.uint8)
    p = a.ctypes.data
    assert store.register_buffer(p, a.nbytes) == OK
    assert store.register_buffer(p, a.nbytes) == INVALID  # the same range again
    assert store.register_buffer(p + 4096, 100) == INVALID  # inside
    assert store.register_buffer(p - 100, 200) == INVALID  # straddles the start
    assert store.register_buffer(0, 10) == INVALID
    assert store.register_buffer(p, 0) == INVALID
    assert store.unregister_buffer(p + 1) == INVALID  # not a start
    assert store.unregister_buffer(p) == OK
    assert store.unregister_buffer(p) == INVALID
    assert store.register_buffer(p, a.nbytes) == OK  # reusable after unregister


def test_put_from_get_into_roundtrip(store):
    src = _buf(1 << 20, 1)
    dst = np.zeros_like(src)
    assert store.put_from("k", src.ctypes.data, src.nbytes) == OK
    assert store.get_into("k", dst.ctypes.data, dst.nbytes) == src.nbytes
    assert np.array_equal(src, dst)
    assert store.get("k") == src.tobytes()
    # Unregistered memory works too; registered memory the same.
    assert store.register_buffer(dst.ctypes.data, dst.nbytes) == OK
    dst[:] = 0
    assert store.get_into("k", dst.ctypes.data, dst.nbytes) == src.nbytes
    assert np.array_equal(src, dst)


def test_get_into_larger_buffer_returns_bytes_read(store):
    assert store.put("k", b"abc") == OK
    dst = np.full(16, 7, dtype=np.uint8)
    assert store.get_into("k", dst.ctypes.data, 16) == 3
    assert bytes(dst[:3]) == b"abc" and (dst[3:] == 7).all()


def test_buffer_too_small_writes_nothing(store):
    src = _buf(4096, 2)
    assert store.put_from("k", src.ctypes.data, src.nbytes) == OK
    dst = np.full(8192, 0xEE, dtype=np.uint8)
    assert store.get_into("k", dst.ctypes.data, 4095) == INVALID
    assert (dst == 0xEE).all()  # nothing written, not even inside the buffer


def test_range_crossing_a_registered_buffer_is_rejected(store):
    a = np.zeros(8192, dtype=np.uint8)
    assert store.register_buffer(a.ctypes.data, 4096) == OK
    assert store.put("k", bytes(100)) == OK
    assert store.get_into("k", a.ctypes.data + 4000, 200) == INVALID  # runs past its end
    assert store.put_from("k2", a.ctypes.data + 4000, 200) == INVALID
    assert store.put_from("k2", 0, 10) == INVALID
    assert store.is_exist("k2") == 0
    assert store.get_into("k", a.ctypes.data + 3000, 200) == 100


def test_missing_key_and_batch_results(store):
    srcs = [_buf(1000 * (i + 1), i) for i in range(3)]
    keys = ["b0", "b1", "b2"]
    assert store.batch_put_from(keys, [s.ctypes.data for s in srcs], [s.nbytes for s in srcs]) == [OK] * 3
    dsts = [np.zeros(4000, dtype=np.uint8) for _ in range(4)]
    r = store.batch_get_into(keys[:2] + ["missing"] + keys[2:], [d.ctypes.data for d in dsts], [4000] * 4)
    assert r == [1000, 2000, ErrorCode.OBJECT_NOT_FOUND, 3000]
    for d, s in ((dsts[0], srcs[0]), (dsts[1], srcs[1]), (dsts[3], srcs[2])):
        assert np.array_equal(d[:s.nbytes], s)


def test_mismatched_and_empty_lists(store):
    a = np.zeros(64, dtype=np.uint8)
    p = a.ctypes.data
    assert store.batch_put_from(["a", "b"], [p], [8, 8]) == [INVALID, INVALID]
    assert store.batch_get_into(["a", "b", "c"], [p, p], [8, 8]) == [INVALID] * 3
    assert store.batch_put_from_multi_buffers(["a"], [[p, p]], [[8]]) == [INVALID]
    assert store.batch_get_into_multi_buffers(["a", "b"], [[p]], [[8]]) == [INVALID, INVALID]
    assert store.batch_put_from([], [], []) == []
    assert store.batch_get_into([], [], []) == []
    assert store.batch_put_from_multi_buffers([], [], []) == []
    assert store.batch_get_into_multi_buffers([], [], []) == []
    assert store.batch_get_buffer([]) == []
    assert store.is_exist("a") == 0


def test_multi_buffers_gather_and_scatter(store):
    layers, block = 4, 4096
    k = [_buf(block, 10 + i) for i in range(layers)]
    v = [_buf(block, 20 + i) for i in range(layers)]
    keys = ["req/0", "req/1"]
    ptrs = [[x.ctypes.data for x in k[:2] + v[:2]], [x.ctypes.data for x in k[2:] + v[2:]]]
    sizes = [[block] * 4, [block] * 4]
    assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [OK, OK]
    assert store.get("req/0") == b"".join(x.tobytes() for x in k[:2] + v[:2])
    outs = [np.zeros(block, dtype=np.uint8) for _ in range(8)]
    optrs = [[o.ctypes.data for o in outs[:4]], [o.ctypes.data for o in outs[4:]]]
    assert store.batch_get_into_multi_buffers(keys, optrs, sizes) == [4 * block, 4 * block]
    for o, want in zip(outs, k[:2] + v[:2] + k[2:] + v[2:]):
        assert np.array_equal(o, want)
    small = [[o.ctypes.data for o in outs[:2]]]
    assert store.batch_get_into_multi_buffers(["req/0"], small, [[block, block]]) == [INVALID]


def test_put_from_with_metadata_and_get_into_ranges(store):
    data = _buf(1000, 3)
    meta = np.frombuffer(b"META", dtype=np.uint8).copy()
    assert store.put_from_with_metadata("m", data.ctypes.data, meta.ctypes.data, 1000, 4) == OK
    assert store.get("m") == b"META" + data.tobytes()
    out = np.zeros(64, dtype=np.uint8)
    r = store.get_into_ranges([out.ctypes.data], [["m", "missing"]], [[[0, 10], [20]]],
                              [[[0, 4], [0]]], [[[4, 6], [5]]])
    assert r == [[[4, 6], [ErrorCode.OBJECT_NOT_FOUND]]]
    assert bytes(out[:4]) == b"META" and np.array_equal(out[10:16], data[:6])
    r = store.get_into_ranges([out.ctypes.data], [["m"]], [[[0]]], [[[1000]]], [[[10]]])
    assert r == [[[INVALID]]]  # range outside the value
    r = store.get_into_ranges([out.ctypes.data], [["m"]], [[[0, 1]]], [[[0]]], [[[1]]])
    assert r == [[[INVALID, INVALID]]]  # ragged lists: one code per destination offset, as Mooncake


def test_upsert_from_forms(store):
    a, b = _buf(100, 4), _buf(300, 5)
    assert store.put_from("u", a.ctypes.data, 100) == OK
    assert store.put_from("u", b.ctypes.data, 300) == OK
    assert store.get("u") == a.tobytes()
    assert store.upsert_from("u", b.ctypes.data, 300) == OK
    assert store.get("u") == b.tobytes()
    assert store.batch_upsert_from(["u", "u2"], [a.ctypes.data, b.ctypes.data], [100, 300]) == [OK, OK]
    assert store.get_batch(["u", "u2"]) == [a.tobytes(), b.tobytes()]


def test_get_buffer_is_a_readonly_view(store):
    value = _buf(1 << 20, 6)
    assert store.put("v", value) == OK
    h = store.get_buffer("v")
    assert isinstance(h, BufferHandle)
    assert len(h) == h.size() == value.nbytes and h.ptr() != 0
    mv = memoryview(h)
    assert mv.readonly and mv.nbytes == value.nbytes
    assert np.array_equal(np.frombuffer(h, dtype=np.uint8), value)
    with pytest.raises((TypeError, ValueError)):
        mv[0] = 1
    assert store.get_buffer("missing") is None
    hs = store.batch_get_buffer(["v", "missing", "v"])
    assert hs[1] is None and bytes(hs[0]) == bytes(hs[2]) == value.tobytes()


def test_handle_outlives_remove(store):
    value = _buf(256 << 10, 7)
    assert store.put("pinned", value) == OK
    h = store.get_buffer("pinned")
    assert store.remove("pinned") == ErrorCode.OBJECT_HAS_LEASE
    assert store.remove("pinned", force=True) == OK
    assert store.is_exist("pinned") == 0
    # Churn the pool: the pinned extent must not be handed out again.
    for i in range(300):
        assert store.put(f"churn{i}", _buf(256 << 10, 100 + i)) == OK
        if i % 2:
            store.remove(f"churn{i - 1}", force=True)
    assert np.array_equal(np.frombuffer(h, dtype=np.uint8), value)
    del h
    gc.collect()
    assert store.put("pinned", b"again") == OK and store.get("pinned") == b"again"


def test_remove_all_skips_pinned_unless_forced(store):
    assert store.put("p", b"v") == OK
    h = store.get_buffer("p")
    assert store.remove_all() == 0 and store.is_exist("p") == 1
    assert store.remove_all(force=True) == 1
    assert bytes(h) == b"v"


def test_handle_outlives_close(master):
    from conftest import connect
    s = connect(master)
    assert s.put("k", b"payload") == OK
    h = s.get_buffer("k")
    assert s.close() == 0
    assert bytes(h) == b"payload"  # the mapping stays while the handle lives
    del h
    gc.collect()


def test_numpy_everywhere(store):
    arr = np.arange(4096, dtype=np.float32)
    assert store.put("np", arr) == OK
    out = np.empty_like(arr)
    assert store.get_into("np", out.ctypes.data, out.nbytes) == arr.nbytes
    assert np.array_equal(out, arr)
    h = store.get_buffer("np")
    assert np.array_equal(np.frombuffer(h, dtype=np.float32), arr)


def test_get_into_ranges_stay_inside_the_registered_buffer_of_their_base(store):
    """A destination offset that leaves the registered buffer holding the base
    pointer is refused (-600) and writes nothing, even where the memory
    beyond is the caller's (here: the unregistered rest of the array)."""
    value = _buf(4096, 7)
    assert store.put("r", value.tobytes()) == OK
    arena = np.full(16384, 0xEE, dtype=np.uint8)
    base = arena.ctypes.data
    assert store.register_buffer(base, 4096) == OK
    one = lambda dst, src, n: store.get_into_ranges([base], [["r"]], [[[dst]]], [[[src]]], [[[n]]])[0][0]
    assert one(4000, 0, 200) == [INVALID]          # runs past the end
    assert one(6000, 0, 100) == [INVALID]          # starts past the end
    assert one(1 << 63, 0, 1) == [INVALID]         # an offset far away
    assert one((1 << 64) - 8, 0, 16) == [INVALID]  # an offset that wraps the pointer
    assert (arena == 0xEE).all()
    assert one(96, 0, 4000) == [4000]  # exactly to the end
    assert np.array_equal(arena[96:4096], value[:4000]) and (arena[4096:] == 0xEE).all()
    # One bad range fails its key; the key's other ranges are not copied either.
    arena[:] = 0xEE
    r = store.get_into_ranges([base], [["r"]], [[[0, 4090]]], [[[0, 0]]], [[[10, 10]]])
    assert r == [[[INVALID, INVALID]]] and (arena == 0xEE).all()
    # A base inside the buffer (not at its start) is bounded by the same end.
    assert store.get_into_ranges([base + 4000], [["r"]], [[[0]]], [[[0]]], [[[97]]]) == [[[INVALID]]]
    assert store.get_into_ranges([base + 4000], [["r"]], [[[0]]], [[[0]]], [[[96]]]) == [[[96]]]
    assert store.unregister_buffer(base) == OK


def test_get_into_larger_than_its_registered_buffer_writes_nothing(store):
    value = _buf(8192, 8)
    assert store.put("big", value.tobytes()) == OK
    arena = np.full(16384, 0xEE, dtype=np.uint8)
    p = arena.ctypes.data
    assert store.register_buffer(p, 2048) == OK
    assert store.get_into("big", p, 8192) == INVALID
    assert store.get_into("big", p + 1024, 4096) == INVALID
    assert store.batch_get_into(["big"], [p], [8192]) == [INVALID]
    assert store.batch_get_into_multi_buffers(["big"], [[p, p + 1024]], [[1024, 7168]]) == [INVALID]
    assert (arena == 0xEE).all()
    assert store.unregister_buffer(p) == OK


def _strict_store(master, how, monkeypatch):
    from conftest import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    if how == "env":
        monkeypatch.setenv("MC_CXL_STRICT_BUFFERS", "1")
        rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", master.address)
    elif how == "option":
        rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", master.address, strict_buffers=True)
    else:
        rc = s.setup({"local_hostname": "127.0.0.1:0", "metadata_server": "P2PHANDSHAKE", "protocol": "cxl",
                      "master_server_addr": master.address, "strict_buffers": True})
    assert rc == OK
    return s


@pytest.mark.parametrize("how", ["env", "option", "dict"])
def test_strict_buffers_refuse_unregistered_memory(master, how, monkeypatch):
    s = _strict_store(master, how, monkeypatch)
    try:
        value = _buf(1000, 9)
        assert s.put("v", value.tobytes()) == OK
        loose = np.full(2000, 0xEE, dtype=np.uint8)
        assert s.get_into("v", loose.ctypes.data, 2000) == INVALID
        assert s.put_from("w", loose.ctypes.data, 100) == INVALID
        assert s.batch_get_into(["v"], [loose.ctypes.data], [2000]) == [INVALID]
        assert s.get_into_ranges([loose.ctypes.data], [["v"]], [[[0]]], [[[0]]], [[[10]]]) == [[[INVALID]]]
        assert (loose == 0xEE).all() and s.is_exist("w") == 0
        reg = np.zeros(2000, dtype=np.uint8)
        assert s.register_buffer(reg.ctypes.data, reg.nbytes) == OK
        assert s.get_into("v", reg.ctypes.data, 2000) == 1000 and np.array_equal(reg[:1000], value)
        assert s.put_from("w", reg.ctypes.data, 100) == OK
        assert s.get_into_ranges([reg.ctypes.data], [["v"]], [[[1500]]], [[[0]]], [[[10]]]) == [[[10]]]
    finally:
        s.close()


def test_unregistered_memory_is_accepted_by_default(store, monkeypatch):
    monkeypatch.delenv("MC_CXL_STRICT_BUFFERS", raising=False)
    assert store.put("u", b"abc") == OK
    loose = np.zeros(16, dtype=np.uint8)
    assert store.get_into("u", loose.ctypes.data, 16) == 3 and bytes(loose[:3]) == b"abc"
