"""The tensor family (put_tensor, get_tensor, batch/_into/_from/pub/upsert,
_with_tp, _with_parallelism, safetensors) on our store: round trips of every
dtype torch has, 0-d, empty and non-contiguous tensors; Mooncake's header
layout; zero-copy reads; one master round trip per batch put and none per get.
The byte layout is checked against the reference store itself in
tests/compat/test_conformance.py (group "tensors, replicas, sessions").
"""
import struct
import urllib.request

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install '.[torch]' "
                            "(scripts/run_tests.sh installs torch==2.13.0)")

import tensor_workers  # noqa: E402
from mooncake_cxl import ParallelAxis, ReadTarget, TensorParallelism  # noqa: E402
from mooncake_cxl.tensor import HEADER_SIZE, parse_meta  # noqa: E402

INVALID, NOT_FOUND, HAS_LEASE = -600, -704, -706
DTYPES = [torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16,
          torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
          torch.float8_e4m3fn, torch.float8_e5m2]
# Mooncake's TensorDtype codes
CODES = {torch.float32: 0, torch.float64: 1, torch.int8: 2, torch.uint8: 3, torch.int16: 4,
         torch.uint16: 5, torch.int32: 6, torch.uint32: 7, torch.int64: 8, torch.uint64: 9,
         torch.bool: 10, torch.float16: 11, torch.bfloat16: 12, torch.float8_e4m3fn: 13,
         torch.float8_e5m2: 14}


def sample(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    return (torch.arange(n, dtype=torch.float64) % 7 - 2).to(dtype).reshape(shape)


def same(a, b):
    """Equal dtype, shape and bytes (NaN-safe, works for float8)."""
    return a.dtype == b.dtype and a.shape == b.shape and \
        torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def requests(master):
    """master_<op>_requests_total by op, from /metrics."""
    text = urllib.request.urlopen(master.metrics_url + "/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("master_") and "_requests_total " in line:
            name, value = line.rsplit(" ", 1)
            out[name[len("master_"):-len("_requests_total")]] = float(value)
    return out


def header(raw):
    return struct.unpack_from("<IHHiiIIQQ", raw)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_every_dtype(store, dtype):
    t = sample(dtype, (3, 5))
    assert store.put_tensor("t", t) == 0
    back = store.get_tensor("t")
    assert same(back, t)
    raw = store.get("t")
    assert len(raw) == HEADER_SIZE + t.numel() * t.element_size()
    assert header(raw)[:5] == (0x4D4F4F4E, 1, 304, CODES[dtype], 2)
    assert raw[HEADER_SIZE:] == t.numpy().tobytes() if dtype not in (
        torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2) else True


def test_shapes_0d_empty_noncontiguous_8d(store):
    cases = {
        "zero_d": torch.tensor(3.5),
        "empty": torch.empty(0, 3),
        "empty_mid": torch.empty(2, 0, 4, dtype=torch.int16),
        "transposed": torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),
        "strided": torch.arange(40, dtype=torch.int64).reshape(4, 10)[:, ::3],
        "eight_d": sample(torch.float16, (1, 2, 1, 2, 1, 2, 1, 2)),
    }
    for key, t in cases.items():
        assert store.put_tensor(key, t) == 0, key
        back = store.get_tensor(key)
        assert same(back, t), key
        assert back.is_contiguous(), key
    assert store.get_tensor("zero_d").dim() == 0  # the reference returns shape (1,)


def test_bad_input_is_refused_and_store_usable(store):
    assert store.put_tensor("c", torch.ones(2, dtype=torch.complex64)) == INVALID
    assert store.put_tensor("nine", torch.ones([1] * 9)) == INVALID
    assert store.put_tensor("bytes", b"abc") == INVALID
    assert store.put_tensor("", torch.ones(2)) == INVALID
    assert store.get_tensor("missing") is None
    assert store.put("notatensor", b"x" * 400) == 0
    assert store.get_tensor("notatensor") is None  # bad magic: None, logged
    # a header whose data size does not match its shape is refused, nothing built
    t = torch.ones(4)
    assert store.put_tensor("good", t) == 0
    raw = bytearray(store.get("good"))
    struct.pack_into("<q", raw, 40, 5)  # global_shape[0] = 5 elements for 16 bytes
    struct.pack_into("<q", raw, 40 + 64, 5)
    assert store.put("lying", bytes(raw)) == 0
    assert store.get_tensor("lying") is None
    assert same(store.get_tensor("good"), t)


def test_requires_grad_and_views(store):
    t = torch.ones(3, 4, requires_grad=True)
    assert store.put_tensor("g", t) == 0
    assert same(store.get_tensor("g"), t.detach())
    base = torch.arange(100, dtype=torch.int32)
    assert store.put_tensor("slice", base[10:20]) == 0
    assert torch.equal(store.get_tensor("slice"), base[10:20])


def test_get_tensor_is_a_private_copy(store):
    t = torch.arange(8, dtype=torch.float32)
    assert store.put_tensor("k", t) == 0
    a = store.get_tensor("k")
    a += 100
    assert torch.equal(store.get_tensor("k"), t)
    assert store.remove("k", force=True) == 0
    assert torch.equal(a, t + 100)  # still readable: it owns its bytes


def test_get_tensor_view_pins_the_object(store):
    t = torch.arange(1024, dtype=torch.int64)
    assert store.put_tensor("v", t) == 0
    v = store.get_tensor("v", view=True)
    assert torch.equal(v, t)
    assert store.remove("v") == HAS_LEASE  # the read's lease (a view alone would not refuse)
    w = v[10:20]
    del v
    assert store.remove("v", force=True) == 0  # unlinked; its bytes stay until the last view (w) goes
    assert store.get_tensor("v") is None
    assert store.put_tensor("v", torch.zeros(1024, dtype=torch.int64)) == 0  # may not reuse them
    assert torch.equal(w, t[10:20])
    del w
    assert torch.equal(store.get_tensor("v"), torch.zeros(1024, dtype=torch.int64))


def test_get_tensor_into_writes_in_place(store):
    t = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    assert store.put_tensor("t", t) == 0
    buf = torch.zeros(1024, dtype=torch.uint8)
    out = store.get_tensor_into("t", buf.data_ptr(), buf.numel())
    assert torch.equal(out, t)
    assert out.data_ptr() == buf.data_ptr() + HEADER_SIZE  # a view of the caller's buffer
    buf[HEADER_SIZE:HEADER_SIZE + 4] = 0  # writes through
    assert out[0, 0] == 0 and out[0, 1] == 1
    assert torch.equal(store.get_tensor_into("t", buf), t)  # a tensor as the buffer (ours)
    registered = torch.zeros(512, dtype=torch.uint8)
    assert store.register_buffer(registered.data_ptr(), 512) == 0
    assert torch.equal(store.get_tensor_into("t", registered.data_ptr(), 512), t)
    assert store.unregister_buffer(registered.data_ptr()) == 0


def test_get_tensor_into_too_small_writes_nothing(store):
    assert store.put_tensor("t", torch.ones(100)) == 0  # 304 + 400 bytes
    buf = torch.full((703,), 0xAB, dtype=torch.uint8)
    assert store.get_tensor_into("t", buf.data_ptr(), 703) is None
    assert bool((buf == 0xAB).all())
    assert store.get_tensor_into("missing", buf.data_ptr(), 703) is None
    assert bool((buf == 0xAB).all())
    assert store.batch_get_tensor_into(["t"], [buf.data_ptr()], [703]) == [None]
    assert bool((buf == 0xAB).all())


def test_batches_one_put_round_trip_no_get_round_trip(master, store):
    keys = [f"b{i}" for i in range(8)]
    ts = [sample(dt, (i + 1, 3)) for i, dt in enumerate(DTYPES[:8])]
    before = requests(master)
    assert store.batch_put_tensor(keys, ts) == [0] * 8
    after = requests(master)
    assert after["put_start"] - before["put_start"] == 1  # one master round trip for 8 tensors
    back = store.batch_get_tensor(keys + ["missing"])
    assert back[-1] is None and all(same(b, t) for b, t in zip(back, ts))
    bufs = [torch.zeros(HEADER_SIZE + 256, dtype=torch.uint8) for _ in keys]
    into = store.batch_get_tensor_into(keys, [b.data_ptr() for b in bufs], [b.numel() for b in bufs])
    assert all(same(b, t) for b, t in zip(into, ts))
    views = store.batch_get_tensor(keys, view=True)
    assert all(same(b, t) for b, t in zip(views, ts))
    del views
    final = requests(master)
    # Gets: no master round trip (a non-coherent pool's leases travel on
    # their own thread, not on a get's path).
    background = ("heartbeat", "leases")
    assert {k: v for k, v in final.items() if k not in background} == \
        {k: v for k, v in after.items() if k not in background}
    assert store.batch_put_tensor([], []) == []
    assert store.batch_put_tensor(["x"], [ts[0], ts[1]]) == [INVALID]
    assert store.batch_put_tensor(["ok", "bad"], [ts[0], "nope"]) == [0, INVALID]


def test_upsert_and_pub(store):
    from mooncake_cxl import ReplicateConfig
    assert store.put_tensor("u", torch.ones(3)) == 0
    assert store.put_tensor("u", torch.zeros(9)) == 0  # a put keeps the first value
    assert torch.equal(store.get_tensor("u"), torch.ones(3))
    assert store.upsert_tensor("u", torch.zeros(9)) == 0
    assert torch.equal(store.get_tensor("u"), torch.zeros(9))
    assert store.batch_upsert_tensor(["u", "u2"], [torch.ones(2), torch.ones(1)]) == [0, 0]
    assert torch.equal(store.get_tensor("u"), torch.ones(2))
    cfg = ReplicateConfig()
    cfg.with_hard_pin = True
    assert store.pub_tensor("p", torch.ones(4), cfg) == 0
    assert store.upsert_pub_tensor("p", torch.ones(5), cfg) == 0
    assert store.batch_pub_tensor(["p1", "p2"], [torch.ones(1), torch.ones(2)], cfg) == [0, 0]
    assert store.batch_upsert_pub_tensor(["p1"], [torch.zeros(1)]) == [0]
    bad = ReplicateConfig()
    bad.preferred_segments = ["a", "b"]
    assert store.pub_tensor("p3", torch.ones(1), bad) == INVALID
    assert store.batch_pub_tensor(["p3"], [torch.ones(1)], bad) == [INVALID]
    assert store.is_exist("p3") == 0


def test_from_buffers(store):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert store.put_tensor("src", t) == 0
    obj = np.frombuffer(store.get("src"), dtype=np.uint8).copy()
    ptr, n = obj.ctypes.data, obj.nbytes
    assert store.put_tensor_from("f1", ptr, n) == 0
    assert store.get("f1") == obj.tobytes()
    assert store.batch_put_tensor_from(["f2", "f3"], [ptr, ptr], [n, n]) == [0, 0]
    assert torch.equal(store.get_tensor("f3"), t)
    assert store.upsert_tensor_from("f1", ptr, n) == 0
    assert store.batch_upsert_tensor_from(["f1"], [ptr], [n]) == [0]
    assert store.put_tensor_from("bad", ptr, 100) == INVALID
    assert store.put_tensor_from("bad", ptr, n - 1) == INVALID  # data size no longer matches
    assert store.batch_put_tensor_from(["g1", "g2"], [ptr, ptr], [n, 10]) == [INVALID, INVALID]
    assert store.batch_put_tensor_from([], [], []) == []
    assert store.is_exist("bad") == 0 and store.is_exist("g1") == 0
    # a buffer left by get_tensor_into is a valid source
    buf = torch.zeros(1024, dtype=torch.uint8)
    assert store.get_tensor_into("src", buf.data_ptr(), 1024) is not None
    assert store.put_tensor_from("f4", buf.data_ptr(), n) == 0
    assert torch.equal(store.get_tensor("f4"), t)


def test_tp_split_and_headers(store):
    big = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    assert store.put_tensor_with_tp("w", big, tp_rank=0, tp_size=2, split_dim=0) == 0
    assert store.is_exist("w") == 0
    for r in range(2):
        assert torch.equal(store.get_tensor_with_tp("w", r, 2), big[2 * r:2 * r + 2])
    raw = store.get("w_tp_1")
    assert header(raw) == (0x4D4F4F4E, 1, 304, 0, 2, 1, 0, 304, 48)  # SHARD layout
    assert struct.unpack_from("<8q8qII", raw, 40) == (4, 6, -1, -1, -1, -1, -1, -1,
                                                       2, 6, -1, -1, -1, -1, -1, -1, 1, 0)
    assert struct.unpack_from("<iiiiiiq", raw, 176) == (1, 0, 1, 2, 0, 0, 2)
    assert store.put_tensor_with_tp("c", big, tp_size=3, split_dim=1) == 0
    assert torch.equal(torch.cat([store.get_tensor_with_tp("c", r, 3, 1) for r in range(3)], 1), big)
    assert store.put_tensor_with_tp("uneven", torch.ones(5, 4), tp_size=2) == INVALID
    assert store.put_tensor_with_tp("dim", big, tp_size=2, split_dim=2) == INVALID
    assert store.is_exist("uneven_tp_0") == 0
    assert store.get_tensor_with_tp("w", 5, 8) is None  # no such shard
    assert store.put_tensor("plain", big) == 0
    assert torch.equal(store.get_tensor_with_tp("plain"), big)  # tp_size 1: the key itself
    assert store.put("plain_tp_0", store.get("plain")) == 0
    assert store.get_tensor_with_tp("plain", 0, 2) is None  # not a shard: refused
    # batches and the _into / _from / pub forms
    assert store.batch_put_tensor_with_tp(["b1", "b2"], [big, big[:2]], tp_size=2) == [0, 0]
    assert torch.equal(store.batch_get_tensor_with_tp(["b1", "b2"], 1, 2)[1], big[1:2])
    bufs = [torch.zeros(400, dtype=torch.uint8) for _ in range(2)]
    got = store.batch_get_tensor_with_tp_into(["b1", "nope"], [b.data_ptr() for b in bufs], [400, 400], 0, 2)
    assert torch.equal(got[0], big[:2]) and got[1] is None
    assert torch.equal(store.get_tensor_with_tp_into("b1", bufs[0].data_ptr(), 400, 1, 2), big[2:])
    obj = np.frombuffer(store.get("plain"), dtype=np.uint8).copy()
    assert store.put_tensor_with_tp_from("fr", obj.ctypes.data, obj.nbytes, 0, 2, 1) == 0
    assert torch.equal(store.get_tensor_with_tp("fr", 1, 2, 1), big[:, 3:])
    assert store.batch_put_tensor_with_tp_from(["fr2"], [obj.ctypes.data], [obj.nbytes], 0, 2, 0) == [0]
    assert torch.equal(store.get_tensor_with_tp("fr2", 0, 2), big[:2])
    assert store.pub_tensor_with_tp("pt", big, None, 0, 2, 0) == 0
    assert store.batch_pub_tensor_with_tp(["pt2"], [big], None, 0, 2, 0) == [0]
    assert torch.equal(store.get_tensor_with_tp("pt2", 1, 2), big[2:])


def test_parallelism(store):
    big = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    halves = [big[:, :3], big[:, 3:]]
    tp = [TensorParallelism([ParallelAxis("tp", r, 2, 1)]) for r in range(2)]
    # one TP axis: each rank stores the shard it holds, under key_tp_<rank>
    for r in range(2):
        assert store.put_tensor_with_parallelism("p", halves[r], tp[r]) == 0
    assert store.batch_is_exist(["p_tp_0", "p_tp_1", "p"]) == [1, 1, 0]
    raw = store.get("p_tp_1")
    assert struct.unpack_from("<8q8qI", raw, 40)[:2] == (4, 6)  # global shape: 2 shards of (4, 3)
    assert torch.equal(store.get_tensor_with_parallelism("p", ReadTarget("full", tp[0])), big)
    assert torch.equal(store.get_tensor_with_parallelism("p", ReadTarget("shard", tp[1])), halves[1])
    assert torch.equal(store.get_tensor_with_tp("p", 1, 2, 1), halves[1])  # the same keys as _with_tp
    assert store.get_tensor_with_parallelism("p", ReadTarget("shard", TensorParallelism(
        [ParallelAxis("tp", 1, 2, 0)]))) is None  # another split: mismatch
    assert store.put_tensor_with_parallelism("lone", halves[0], tp[0]) == 0
    assert store.get_tensor_with_parallelism("lone", ReadTarget("full", tp[0])) is None  # rank 1 missing
    # several axes: each rank stores its part of the full tensor; Mooncake's key names
    axes = [TensorParallelism([ParallelAxis("tp", r, 2, 0), ParallelAxis("dp", 1, 2)]) for r in range(2)]
    assert store.put_tensor_with_parallelism("m", big, axes[1]) == 0
    assert store.batch_is_exist(["m__dp_1of2__tp_0of2_sd0", "m__dp_1of2__tp_1of2_sd0"]) == [0, 1]
    assert store.get_tensor_with_parallelism("m", ReadTarget("full", axes[0])) is None
    assert store.put_tensor_with_parallelism("m", big, axes[0]) == 0
    assert torch.equal(store.get_tensor_with_parallelism("m", ReadTarget("full", axes[1])), big)
    assert torch.equal(store.get_tensor_with_parallelism("m", ReadTarget("shard", axes[1])), big[2:])
    ep = TensorParallelism([ParallelAxis("ep", 0, 4, expert_id=3)])
    assert store.put_tensor_with_parallelism("e", big, ep) == 0
    assert torch.equal(store.get_tensor("e__ep_0of4_eid3"), big)
    assert torch.equal(store.get_tensor_with_parallelism("e", ReadTarget("shard", ep)), big)
    # writer partitions: this writer's shard of the full tensor, and a manifest
    class WP:
        def __init__(self, rank, size=3, split_dim=1):
            self.rank, self.size, self.split_dim = rank, size, split_dim
    for r in range(3):
        assert store.put_tensor_with_parallelism("w", big, writer_partition=WP(r)) == 0
    assert store.is_exist("w__writer_2of3_sd1") == 1 and len(store.get("w__writer_manifest")) == 96
    assert torch.equal(store.get_tensor_with_parallelism("w", ReadTarget("full")), big)
    assert torch.equal(store.get_tensor_with_parallelism(
        "w", ReadTarget("shard", TensorParallelism([ParallelAxis("tp", 2, 3, 1)]))), big[:, 4:])
    buf = torch.zeros(1024, dtype=torch.uint8)
    assert torch.equal(store.get_tensor_with_parallelism_into("w", buf.data_ptr(), 1024, ReadTarget("full")), big)
    assert store.get_tensor_with_parallelism_into("w", buf.data_ptr(), 100, ReadTarget("full")) is None
    assert store.put_tensor_with_parallelism("x", big, writer_partition=WP(0, 4)) == INVALID  # uneven
    # as stored, batches, upsert
    assert store.put_tensor_with_parallelism("plain", big) == 0
    assert torch.equal(store.get_tensor_with_parallelism("plain"), big)
    assert torch.equal(store.batch_get_tensor_with_parallelism(["plain"])[0], big)
    assert torch.equal(store.batch_get_tensor_with_parallelism(["p"], [ReadTarget("full", tp[0])])[0], big)
    assert torch.equal(store.batch_get_tensor_with_parallelism_into(["plain"], [buf.data_ptr()], [1024])[0], big)
    assert store.batch_put_tensor_with_parallelism(["q1", "q2"], halves, tp) == [0, 0]
    assert store.batch_is_exist(["q1_tp_0", "q2_tp_1"]) == [1, 1]
    assert store.batch_put_tensor_with_parallelism(["q3"], [big]) == [0]
    assert store.upsert_tensor_with_parallelism("q3", big * 2) == 0
    assert torch.equal(store.get_tensor("q3"), big * 2)
    assert store.batch_upsert_tensor_with_parallelism(["q1"], [halves[1] * 2], [tp[0]]) == [0]
    assert torch.equal(store.get_tensor("q1_tp_0"), halves[1] * 2)
    # the _from forms: the buffer holds the full tensor; every TP rank's shard is stored
    obj = np.frombuffer(store.get("plain"), dtype=np.uint8).copy()
    assert store.put_tensor_with_parallelism_from("r", obj.ctypes.data, obj.nbytes, tp[1]) == 0
    assert store.batch_is_exist(["r_tp_0", "r_tp_1"]) == [1, 1]
    assert torch.equal(store.get_tensor_with_parallelism("r", ReadTarget("full", tp[0])), big)
    assert store.batch_put_tensor_with_parallelism_from(["r2"], [obj.ctypes.data], [obj.nbytes], [axes[0]]) == [0]
    assert torch.equal(store.get_tensor_with_parallelism("r2", ReadTarget("full", axes[0])), big)
    assert store.batch_put_tensor_with_parallelism_from(["r3"], [obj.ctypes.data], [obj.nbytes]) == [0]
    assert store.upsert_tensor_with_parallelism_from("r3", obj.ctypes.data, obj.nbytes) == 0
    assert store.batch_upsert_tensor_with_parallelism_from(["r3"], [obj.ctypes.data], [obj.nbytes]) == [0]
    assert store.get("r3") == obj.tobytes()
    # refused: both kinds, a TP axis without split_dim, duplicate kinds, full without TP
    assert store.put_tensor_with_parallelism("x", big, tp[0], None, WP(0)) == INVALID
    assert store.put_tensor_with_parallelism("x", big, TensorParallelism([ParallelAxis("tp", 0, 2)])) == INVALID
    assert store.put_tensor_with_parallelism("x", big, TensorParallelism(
        [ParallelAxis("dp", 0, 2), ParallelAxis("dp", 1, 2)])) == INVALID
    assert store.put_tensor_with_parallelism("x", big, TensorParallelism(
        [ParallelAxis("tp", 0, 4, 1), ParallelAxis("dp", 0, 2)])) == INVALID  # uneven
    assert store.get_tensor_with_parallelism("e", ReadTarget("full", ep)) is None
    with pytest.raises(RuntimeError):
        ReadTarget("sideways")


def test_safetensors(store, tmp_path):
    pytest.importorskip("safetensors", reason="safetensors is not installed (pip install '.[torch]')")
    t = sample(torch.bfloat16, (3, 4))
    assert store.put_tensor("s", t) == 0
    path = str(tmp_path / "s.safetensors")
    assert store.save_tensor_to_safetensor("s", path) == 0
    assert store.save_tensor_to_safetensor("missing", path + "x") == -1100
    back = store.load_tensor_from_safetensor("s2", path)  # not in the file: its first tensor
    assert same(back, t) and same(store.get_tensor("s2"), t)
    assert same(store.load_tensor_from_safetensor(key="s", file_name=path), t)
    assert store.load_tensor_from_safetensor("x", str(tmp_path / "none")) is None


def test_cross_process(master, store, children):
    """Tensors put by another process read back here, every dtype."""
    specs = [(f"x{i}", str(dt).split(".")[1], (2, 3)) for i, dt in enumerate(DTYPES)]
    assert children(tensor_workers.put_tensors, master.address, specs).result() == [0] * len(specs)
    for (key, _, shape), dt in zip(specs, DTYPES):
        want = (torch.arange(6, dtype=torch.float64) % 7).to(dt).reshape(shape)  # as the worker built it
        assert same(store.get_tensor(key), want), key


def test_parse_meta_bounds():
    """Headers from pool memory are validated field by field."""
    from mooncake_cxl.tensor import pack_meta
    good = bytes(pack_meta(0, [2, 3], [2, 3], 24))
    assert parse_meta(good, 304 + 24)[0] is not None
    assert parse_meta(good, 304 + 23)[0] is None  # size mismatch
    assert parse_meta(good[:100], 304 + 24)[0] is None
    for off, fmt, val in [(0, "<I", 1), (4, "<H", 2), (6, "<H", 303), (8, "<i", 15), (12, "<i", 9),
                          (16, "<I", 2), (24, "<Q", 1 << 40), (40, "<q", -2), (168, "<I", 5)]:
        bad = bytearray(good)
        struct.pack_into(fmt, bad, off, val)
        assert parse_meta(bytes(bad), 304 + 24)[0] is None, off
