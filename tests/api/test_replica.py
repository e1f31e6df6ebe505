"""Replica descriptors, batch_replica_clear, the put/get sessions and the
*_multi_buffer_ranges calls, on our store. Their
shapes against the reference store are in tests/compat/test_conformance.py (group
"tensors, replicas, sessions")."""

import numpy as np
import pytest

import tensor_workers
from conftest import REMOTE_RUN, connect, wait_until

INVALID, NOT_FOUND, EXISTS = -600, -704, -705


def buf(data):
    return np.frombuffer(data, dtype=np.uint8).copy()


def test_replica_desc_describes_the_cxl_replica(master):
    s = connect(master, hostname="127.0.0.1:14001")
    try:
        from mooncake_cxl import ReplicaStatus
        assert s.put("k", b"hello world") == 0
        (d,) = s.get_replica_desc("k")
        assert d.status == ReplicaStatus.COMPLETE
        assert (d.is_memory_replica(), d.is_disk_replica(), d.is_local_disk_replica()) == (True, False, False)
        assert d.segment_name == "127.0.0.1:14001" and d.size == 11 and d.offset > 0
        assert d.read_by == ("transfer_engine" if REMOTE_RUN else "pool")  # how this client reads it
        bd = d.get_memory_descriptor().buffer_descriptor
        assert (bd.size, bd.buffer_address, bd.transport_endpoint) == (11, d.offset, "127.0.0.1:14001")
        with pytest.raises(RuntimeError):
            d.get_disk_descriptor()
        h = s.get_buffer("k")  # the offset names the object the handle views
        assert bytes(h) == b"hello world"
        del h
        assert s.get_replica_desc("missing") == []
        got = s.batch_get_replica_desc(["k", "missing", "k"])
        assert list(got) == ["k"] and got["k"][0].offset == d.offset
        assert s.batch_get_replica_desc([]) == {}
        # vLLM's MooncakeStoreConnector: tier of each key from the first descriptor's predicates
        tiers = {k: ("memory" if v and v[0].is_memory_replica() else "unknown") for k, v in got.items()}
        assert tiers == {"k": "memory"}
        # the descriptor lease: a fresh descriptor query protects the object, as in Mooncake
        assert s.remove("k") == -706
        assert s.upsert("k", b"x" * 100) == 0
        (d2,) = s.get_replica_desc("k")
        assert d2.size == 100
    finally:
        s.close()


def test_replica_clear(master_factory, children):
    """Only the writer's own, unleased keys are cleared; others are skipped."""
    m = master_factory(extra_flags=["--default_kv_lease_ttl=300"])
    mine = connect(m, hostname="127.0.0.1:14002")
    try:
        other = "127.0.0.1:14003"
        assert children(tensor_workers.put_bytes, m.address, other, [("theirs", b"t")]).result() == [0]
        assert mine.put_batch(["a", "b", "c"], [b"1", b"2", b"3"]) == 0
        assert mine.get_replica_desc("theirs")[0].segment_name == other
        mine.get("c")  # leased for 300 ms
        assert mine.batch_replica_clear(["a", "missing", "theirs", "c"]) == ["a"]
        assert mine.batch_replica_clear([]) == []
        assert mine.batch_replica_clear(["b"], segment_name="nonexistent_host:99999") == []
        assert mine.batch_replica_clear(["b"], segment_name="127.0.0.1:14002") == ["b"]
        assert wait_until(lambda: mine.batch_replica_clear(["c"]), "c's lease to lapse", interval=0.1) == ["c"]
        assert mine.batch_is_exist(["a", "b", "c", "theirs"]) == [0, 0, 0, 1]
    finally:
        mine.close()


def test_put_session(store):
    src = buf(b"0123456789abcdef")
    p = src.ctypes.data
    assert store.batch_put_session_start(["s1", "s2"], [16, 8]) == [0, 0]
    assert store.is_exist("s1") == 0 and store.get("s1") == b""  # not visible before end
    assert store.batch_put_from_multi_buffer_ranges(
        ["s1", "s2"], [[p, p + 8], [p]], [[8, 8], [8]], [[8, 0], [0]]) == [16, 8]
    assert store.batch_put_from_multi_buffer_ranges(["nosession"], [[p]], [[8]], [[0]]) == [INVALID]
    assert store.batch_put_from_multi_buffer_ranges(["s2"], [[p]], [[8]], [[4]]) == [INVALID]  # past the end
    assert store.batch_put_from_multi_buffer_ranges(["s2"], [[p]], [[8]], [[0, 1]]) == [INVALID]  # shapes
    assert store.batch_put_session_end(["s1", "s2"]) == [0, 0]
    assert store.get("s1") == b"89abcdef01234567" and store.get("s2") == b"01234567"
    assert store.batch_put_session_end(["s1"]) == [INVALID]
    assert store.batch_put_session_start(["s1"], [16]) == [EXISTS]
    assert store.batch_put_session_start(["s3", "bad"], [16, 0]) == [0, INVALID]
    assert store.batch_put_session_start(["s3"], [16]) == [INVALID]  # already open
    assert store.batch_put_session_revoke(["s3", "s4"]) == [0, INVALID]
    assert store.batch_put_session_end(["s3"]) == [INVALID] and store.is_exist("s3") == 0
    assert store.batch_put_session_start(["x"], [1, 2]) == [INVALID]


def test_get_session(store):
    assert store.put("s1", b"89abcdef01234567") == 0
    out = np.zeros(16, dtype=np.uint8)
    p = out.ctypes.data
    assert store.batch_get_into_multi_buffer_ranges(["s1"], [[p]], [[4]], [[2]]) == [INVALID]  # no session
    assert store.batch_get_session_start(["s1", "missing"]) == [0, NOT_FOUND]
    assert store.batch_get_into_multi_buffer_ranges(["s1"], [[p, p + 8]], [[4, 4]], [[2, 12]]) == [8]
    assert out.tobytes() == b"abcd\0\0\0\x004567\0\0\0\0"
    out[:] = 7
    assert store.batch_get_into_multi_buffer_ranges(["s1"], [[p]], [[4]], [[14]]) == [INVALID]
    assert (out == 7).all()  # nothing written
    assert store.batch_get_into_multi_buffer_ranges(["s1", "missing"], [[p], [p]], [[2], [2]],
                                                    [[0], [0]]) == [2, INVALID]
    assert store.batch_get_session_end(["s1"]) == 0
    assert store.batch_get_into_multi_buffer_ranges(["s1"], [[p]], [[4]], [[2]]) == [INVALID]


def test_put_session_loses_to_a_put_by_another_client(master):
    """Ours stages a session privately: a put of the key by another client
    during the session wins, and end reports -705 rather than claiming success."""
    a, b = connect(master, hostname="127.0.0.1:14004"), connect(master, hostname="127.0.0.1:14005")
    try:
        src = buf(b"A" * 8)
        assert a.batch_put_session_start(["k", "other"], [8, 8]) == [0, 0]
        assert a.batch_put_from_multi_buffer_ranges(["k", "other"], [[src.ctypes.data]] * 2, [[8]] * 2,
                                                    [[0]] * 2) == [8, 8]
        assert b.put("k", b"B" * 8) == 0
        assert a.batch_put_session_end(["k", "other"]) == [EXISTS, 0]
        assert a.get("k") == b"B" * 8 and b.get("other") == b"A" * 8
        assert b.batch_put_session_end(["other"]) == [INVALID]  # sessions are per client
    finally:
        a.close()
        b.close()
