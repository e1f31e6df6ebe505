"""Every method of the façade against the contract, in one process: the
Python API of Mooncake's MooncakeDistributedStore (names, parameters and
defaults, return values, error codes) as ours keeps it: core operations,
batch forms, leases, ReplicateConfig, error codes."""
import numpy as np
import pytest

import mooncake_cxl
from mooncake_cxl import ErrorCode, ReplicateConfig, SoftPinAction

OK = 0


def test_module_names():
    for name in ("MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ReplicaStatus",
                 "ObjectDataType", "ErrorCode"):
        assert hasattr(mooncake_cxl, name)
    assert [int(SoftPinAction.PRESERVE), int(SoftPinAction.ENABLE), int(SoftPinAction.DISABLE)] == [0, 1, 2]
    assert ErrorCode.INVALID_PARAMS == -600 and ErrorCode.OBJECT_NOT_FOUND == -704
    assert ErrorCode.OBJECT_HAS_LEASE == -706 and ErrorCode.NO_AVAILABLE_HANDLE == -200
    assert ErrorCode.RPC_FAIL == -900 and ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS == -1010


def test_put_get_roundtrip(store):
    assert store.put("k1", b"hello") == OK
    assert store.get("k1") == b"hello"
    assert store.is_exist("k1") == 1
    assert store.get_size("k1") == 5
    assert isinstance(store.get("k1"), bytes)


def test_put_existing_key_keeps_first_value(store):
    assert store.put("k", b"first") == OK
    assert store.put("k", b"second") == OK
    assert store.get("k") == b"first"


def test_miss_results(store):
    assert store.get("missing") == b""
    assert store.is_exist("missing") == 0
    assert store.get_size("missing") == ErrorCode.OBJECT_NOT_FOUND
    assert store.remove("missing") == ErrorCode.OBJECT_NOT_FOUND


def test_value_types(store):
    assert store.put("ba", bytearray(b"barr")) == OK
    assert store.put("mv", memoryview(b"mview")) == OK
    arr = np.arange(1000, dtype=np.float32)
    assert store.put("np", arr) == OK
    assert store.put("np_nc", np.arange(8, dtype=np.uint8)[::2]) == OK
    assert store.get("ba") == b"barr"
    assert store.get("mv") == b"mview"
    assert np.array_equal(np.frombuffer(store.get("np"), dtype=np.float32), arr)
    assert store.get("np_nc") == bytes([0, 2, 4, 6])  # strided: copied in C order


def test_key_forms(store):
    for key in ("ключ", "a\x00b", "x" * 5000, "with space/and:colon"):
        assert store.put(key, key.encode()) == OK
        assert store.get(key) == key.encode()
    assert store.get("a") == b""


def test_single_key_reads_take_str_or_bytes_keys_and_refuse_others(store):
    # get, is_exist and get_into read their key without a std::string copy;
    # the forms they accept and refuse are those of put.
    value = bytes(range(256)) * 16
    assert store.put("rk/4k", value) == OK
    assert store.get(b"rk/4k") == value and store.is_exist(b"rk/4k") == 1
    dst = np.zeros(len(value), dtype=np.uint8)
    assert store.register_buffer(dst.ctypes.data, dst.nbytes) == OK
    assert store.get_into(b"rk/4k", dst.ctypes.data, dst.nbytes) == len(value)
    assert dst.tobytes() == value
    for bad in ("\ud800", 5, None):
        for call in (lambda k: store.get(k), lambda k: store.is_exist(k),
                     lambda k: store.get_into(k, dst.ctypes.data, dst.nbytes)):
            with pytest.raises(TypeError):
                call(bad)
    assert store.unregister_buffer(dst.ctypes.data) == OK
    assert store.get("rk/4k") == value


def test_reads_below_and_above_the_gil_threshold_beside_another_thread(store):
    # Values under 64 KiB are copied with the GIL held, larger ones without:
    # both stay correct while another Python thread reads too.
    import threading
    values = {f"gil/{n}": bytes([n % 251]) * n for n in (4096, 65535, 65536, 1 << 20)}
    for k, v in values.items():
        assert store.put(k, v) == OK
    errors = []

    def reader(keys):
        for _ in range(200):
            for k in keys:
                if store.get(k) != values[k] or store.is_exist(k) != 1:
                    errors.append(k)

    threads = [threading.Thread(target=reader, args=(list(values),)),
               threading.Thread(target=reader, args=(list(reversed(values)),))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_empty_key_and_value_are_invalid(store):
    assert store.put("", b"x") == ErrorCode.INVALID_PARAMS
    assert store.put("k", b"") == ErrorCode.INVALID_PARAMS
    assert store.upsert("k", b"") == ErrorCode.INVALID_PARAMS
    assert store.is_exist("") == ErrorCode.INVALID_PARAMS
    assert store.get("") == b""
    assert store.put("still-usable", b"v") == OK


def test_non_bytes_value_and_unknown_keyword_raise_type_error(store):
    assert store.put("keep", b"v") == OK
    for bad in ("str", 5, None, 1.5):
        with pytest.raises(TypeError):
            store.put("k_bad", bad)
    with pytest.raises(TypeError):
        store.put("k", b"x", foo=1)
    with pytest.raises(TypeError):
        store.put("k", b"x", config=None)
    with pytest.raises(TypeError):
        store.put_parts("k", b"a", "str-part")
    assert store.get("keep") == b"v" and store.is_exist("k_bad") == 0


def test_put_batch_and_get_batch(store):
    assert store.put_batch(["b1", "b2", "b3"], [b"1", b"22", b"333"]) == OK
    assert store.get_batch(["b1", "b2", "nope", "b3"]) == [b"1", b"22", b"", b"333"]
    assert store.batch_is_exist(["b1", "nope"]) == [1, 0]
    assert store.batch_is_exist([]) == []
    assert store.put_batch([], []) == OK
    assert store.put_batch(["x"], [b"1", b"2"]) == ErrorCode.INVALID_PARAMS
    assert store.put_batch(["e1", "e2"], [b"v", b""]) == ErrorCode.INVALID_PARAMS
    assert store.put_batch(["b1", "b4"], [b"new", b"4"]) == OK
    assert store.get_batch(["b1", "b4"]) == [b"1", b"4"]


def test_put_batch_whose_reply_outgrows_a_ring_record(store, master):
    # 600 short keys: the request fits one ring record, its reply (29 bytes a
    # key) does not; the client sends it over TCP instead of losing the reply.
    for n in (560, 600, 680, 1000):
        keys = [f"s{n}/{i}" for i in range(n)]
        assert store.put_batch(keys, [b"v" * 64] * n) == OK, n
        assert store.batch_is_exist(keys) == [1] * n
    assert store.get_batch(["s600/0", "s600/599"]) == [b"v" * 64] * 2
    assert "reply dropped" not in master.log_tail(1 << 30)


def test_get_batch_of_empty_list_differs_on_purpose(store):
    # The reference returns [b''] for get_batch([]); one result per key is the contract.
    assert store.get_batch([]) == []


def test_put_parts_and_upsert_forms(store):
    assert store.put_parts("pp", b"ab", bytearray(b"cd"), memoryview(b"ef")) == OK
    assert store.get("pp") == b"abcdef"
    assert store.put_parts("pp", b"zz") == OK
    assert store.get("pp") == b"abcdef"
    assert store.upsert_parts("pp", b"12", b"34") == OK
    assert store.get("pp") == b"1234"
    assert store.upsert("u", b"one") == OK
    assert store.upsert("u", b"a much longer second value") == OK
    assert store.get("u") == b"a much longer second value"
    assert store.get_size("u") == len(b"a much longer second value")
    assert store.upsert_batch(["u", "u2"], [b"x", b"y"]) == OK
    assert store.get_batch(["u", "u2"]) == [b"x", b"y"]
    assert store.upsert_batch(["u"], []) == ErrorCode.INVALID_PARAMS


def test_upsert_many_times_leaves_one_object(store):
    for i in range(200):
        assert store.upsert("same", f"value-{i}".encode() * (i % 7 + 1)) == OK
        assert store.get("same") == f"value-{i}".encode() * (i % 7 + 1)
    assert store.remove("same", force=True) == OK
    assert store.is_exist("same") == 0


def test_leases_block_plain_remove(store):
    assert store.put("fresh", b"v") == OK
    assert store.remove("fresh") == OK  # never read: no lease
    for reader in (store.get, store.is_exist, store.get_size):
        assert store.put("leased", b"v") == OK
        reader("leased")
        assert store.remove("leased") == ErrorCode.OBJECT_HAS_LEASE
        assert store.remove("leased", force=True) == OK
        assert store.is_exist("leased") == 0


def test_batch_remove(store):
    assert store.put_batch(["r1", "r2", "r3"], [b"1", b"2", b"3"]) == OK
    store.get("r1")
    assert store.batch_remove(["r1", "nope", "r2"]) == [ErrorCode.OBJECT_HAS_LEASE,
                                                        ErrorCode.OBJECT_NOT_FOUND, OK]
    assert store.batch_remove(["r1", "r3"], force=True) == [OK, OK]
    assert store.batch_remove([]) == []
    assert store.batch_remove(["", "x"]) == [ErrorCode.INVALID_PARAMS, ErrorCode.OBJECT_NOT_FOUND]


def test_remove_by_regex_and_remove_all(store):
    for i in range(5):
        assert store.put(f"rx_{i}", b"v") == OK
    assert store.put("other", b"v") == OK
    assert store.remove_by_regex("^rx_[0-2]$") == 3
    assert store.remove_by_regex("nomatch") == 0
    assert store.remove_by_regex("(") == ErrorCode.INVALID_PARAMS
    assert store.remove_by_regex("x_") == 2  # search, not full match
    store.get("other")
    assert store.put("plain", b"v") == OK
    assert store.remove_all() == 1  # the leased one is skipped
    assert store.is_exist("other") == 1
    assert store.remove_all(force=True) == 1
    assert store.remove_all() == 0


def test_replicate_config_fields_and_str(store):
    c = ReplicateConfig()
    assert (c.replica_num, c.with_hard_pin, c.soft_pin_ttl_ms, c.group_ids) == (1, False, None, None)
    assert c.soft_pin_action == SoftPinAction.PRESERVE and c.with_soft_pin is False
    assert str(c) == ("ReplicateConfig: { replica_num: 1, nof_replica_num: 0, dfs_replica_num: 0, "
                      "soft_pin_action: PRESERVE, soft_pin_ttl_ms: default, with_hard_pin: 0, "
                      "preferred_segments: [], preferred_nof_segments: [], "
                      "prefer_alloc_in_same_node: 0, data_type: UNKNOWN }")
    c.with_soft_pin = True  # Mooncake 0.3.12 spelling
    assert c.soft_pin_action == SoftPinAction.ENABLE
    c.soft_pin_ttl_ms = 5000
    c.group_ids = ["g1", "g2"]
    c.with_hard_pin = True
    c.replica_num = 3
    s = str(c)
    assert "soft_pin_action: ENABLE" in s and "soft_pin_ttl_ms: 5000" in s
    assert "with_hard_pin: 1" in s and "group_ids: [g1, g2]" in s and "replica_num: 3" in s
    assert store.put("cfg", b"v", c) == ErrorCode.INVALID_PARAMS  # one group per key
    c.group_ids = ["g1"]
    for bad in (-1, 2 ** 64, "x", 1.5):
        with pytest.raises(TypeError):
            c.soft_pin_ttl_ms = bad
    c.soft_pin_ttl_ms = 2 ** 64 - 1
    c.soft_pin_ttl_ms = None
    with pytest.raises(AttributeError):
        c.no_such_field = 1
    assert store.put("cfg", b"v", c) == OK  # replica_num > 1 accepted: one copy in the pool
    assert store.get("cfg") == b"v"


def test_invalid_replicate_configs(store):
    c = ReplicateConfig()
    c.replica_num = 0
    assert store.put("c0", b"v", c) == ErrorCode.INVALID_PARAMS
    c = ReplicateConfig()
    c.soft_pin_ttl_ms = 100  # without soft_pin_action ENABLE
    assert store.put("c1", b"v", config=c) == ErrorCode.INVALID_PARAMS
    assert store.is_exist("c0") == 0 and store.is_exist("c1") == 0


def test_value_larger_than_the_pool(store):
    assert store.put("keep", b"v") == OK
    big = bytes(80 << 20)  # the test pool is 64 MiB
    assert store.put("huge", big) == ErrorCode.NO_AVAILABLE_HANDLE
    assert store.is_exist("huge") == 0
    assert store.get("keep") == b"v" and store.put("after", b"ok") == OK


def test_get_hostname_and_health(store):
    assert store.get_hostname() == "127.0.0.1:0"
    assert store.health_check() == 0


def test_large_values_roundtrip(store):
    for size in (1, 63, 64, 65, 4096, 1 << 20, 16 << 20):
        value = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
        assert store.put(f"sz{size}", value) == OK
        assert store.get(f"sz{size}") == value
        assert store.remove(f"sz{size}", force=True) == OK


def test_gil_is_released_during_get(store):
    import threading
    value = bytes(16 << 20)
    assert store.put("big", value) == OK
    results = []
    threads = [threading.Thread(target=lambda: results.append(len(store.get("big")))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [len(value)] * 4


def test_upsert_batch_reads_its_own_writes(store):
    import os
    for it in range(300):
        a, b = os.urandom(100 + it % 50), os.urandom(300)
        key, other = f"u{it % 7}", f"v{it % 5}"
        assert store.upsert(key, b) == OK
        assert store.get(key) == b
        assert store.upsert_batch([key, other], [a, b]) == OK
        assert store.get_batch([key, other]) == [a, b]


def test_noncoherent_pool_mode(master_factory):
    """A pool formatted for CXL 2.0 multi-host sharing: every publish and
    observe goes through the flush helper; the API behaves the same."""
    from conftest import connect
    m = master_factory(extra_flags=["--coherence=noncoherent"])
    s = connect(m)
    try:
        for i in range(50):
            assert s.put(f"nc{i}", bytes([i]) * (1000 + i)) == 0
        assert all(s.get(f"nc{i}") == bytes([i]) * (1000 + i) for i in range(50))
        assert s.upsert("nc0", b"new") == 0 and s.get("nc0") == b"new"
        h = s.get_buffer("nc1")
        assert bytes(h) == bytes([1]) * 1001
        assert s.remove("nc2", force=True) == 0 and s.is_exist("nc2") == 0
    finally:
        s.close()
