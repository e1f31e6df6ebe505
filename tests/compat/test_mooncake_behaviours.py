"""What the store tests that ship in Mooncake's repository check
(mooncake-wheel/tests: test_distributed_object_store.py,
test_distributed_object_store_cxl.py, test_put_get_tensor.py,
test_batch_replica_clear.py, test_dummy_client.py), pinned here by our own
tests: each names the reference behaviour it pins. Not copies: scaled to a
64 MiB pool and a 2-core machine, with the lease (200 ms here, 5 s there)
waited for by polling, never by timing. Where ours differs on purpose the
test asserts our behaviour and says so (data outliving the writer's close();
local_buffer_size=0 not failing puts; one copy per object for
batch_replica_clear). The dummy-client file's behaviours are pinned in
tests/api/test_dummy_client.py (test_ref_dummy_*), batch_replica_clear's in
tests/api/test_replica.py, tenants in tests/security/test_tenants.py and the pool file
replaced between test classes in tests/faults/test_pool_replaced.py; the ones
below are the rest. The real files, for whoever has them, run against this
store through the shim with scripts/run_mooncake_tests.sh DIR (and against
the reference wheel with --reference); the last tests below pin what that run
found (a master started before its CXL file exists, the wheel's
structured_object_store through the shim, the reference master's tenant
flags)."""
import ctypes
import os
import random
import threading

import pytest

from conftest import POOL_SIZE, MooncakeDistributedStore, ReplicateConfig, poll
from mooncake_cxl import SoftPinAction

OK, INVALID, NO_SPACE, NOT_FOUND, HAS_LEASE = 0, -600, -200, -704, -706
LEASE_MS = 200


@pytest.fixture
def lease_master(master_factory):
    return master_factory(extra_flags=[f"--default_kv_lease_ttl={LEASE_MS}"])


def _setup(master, hostname="localhost", local_buffer_size=512 << 20, protocol="tcp"):
    """As the reference tests' get_client(): seven positional arguments."""
    s = MooncakeDistributedStore()
    rc = s.setup(hostname, "http://127.0.0.1:8080/metadata", 3200 << 20, local_buffer_size,
                 protocol, "ibp6s0", master.address)
    assert rc == OK, rc
    return s


@pytest.fixture
def store(lease_master):
    s = _setup(lease_master)
    yield s
    s.close()


def _remove_after_lease(s, key):
    """The reference tests sleep one lease, then remove() == 0; we poll."""
    return poll(lambda: s.remove(key), interval=0.02, done=lambda rc: rc != HAS_LEASE)


def _config_dict(master, segment, buffer):
    return {"local_hostname": "localhost", "metadata_server": "http://127.0.0.1:8080/metadata",
            "global_segment_size": segment, "local_buffer_size": buffer, "protocol": "tcp",
            "rdma_devices": "ibp6s0", "master_server_addr": master.address}


def test_config_dict_human_readable_sizes_and_percentage_refused(lease_master):
    """TestConfigDictSetup: setup(dict) with "16MB" / "16 MB" works and the
    store puts and gets; "50%" is refused (non-zero)."""
    s = MooncakeDistributedStore()
    try:
        assert s.setup(_config_dict(lease_master, "16MB", "16 MB")) == OK
        assert s.put(f"cfg_{os.getpid()}", b"value") == OK and s.get(f"cfg_{os.getpid()}") == b"value"
        s.close()
        assert s.setup(_config_dict(lease_master, "50%", "16MB")) != OK
    finally:
        s.close()


def test_zero_local_buffer_size_puts_work_on_purpose(lease_master):
    """TestZeroLocalBufferSize (both files): the reference's put fails with
    local_buffer_size=0 and is_exist is then 0. Ours differs on purpose: a
    put copies straight into the pool, no local buffer is involved."""
    s = _setup(lease_master, local_buffer_size=0)
    try:
        assert s.put("test_zero_buffer_key", b"test_zero_buffer_value") == OK
        assert s.is_exist("test_zero_buffer_key") == 1
    finally:
        s.close()


def test_client_tear_down_and_reinit(lease_master):
    """test_client_tear_down: close() returns 0, setup() again works and the
    store puts and gets. The CXL file removes the key first and then finds
    get() == b"" after the re-setup (pinned here). The other file expects a
    put key to be gone after its writer's close(); ours keeps it on purpose
    (objects live in the shared pool, not in the writer's segment)."""
    s = _setup(lease_master)
    try:
        assert s.put("test_teardown_key", b"Hello, World!") == OK
        assert s.remove("test_teardown_key") == OK  # a put grants no lease
        assert s.put("kept", b"kept") == OK
        assert s.close() == OK
        s2 = _setup(lease_master)
        assert s2.get("test_teardown_key") == b""
        assert s2.get("kept") == b"kept"  # differs on purpose: outlives its writer's close()
        s2.close()
        s = _setup(lease_master)  # the same object set up again
        assert s.put("test_teardown_key", b"Hello, World!") == OK
        assert s.get("test_teardown_key") == b"Hello, World!"
    finally:
        s.close()


def test_basic_get_hostname_port_range(store):
    """test_basic_get_hostname: local_hostname "localhost" without a port
    reports "localhost:PORT" with 12300 <= PORT <= 14300."""
    host = store.get_hostname()
    assert host.startswith("localhost:")
    assert 12300 <= int(host.split(":")[1]) <= 14300


def test_basic_put_get_exist_put_again_remove(store):
    """test_basic_put_get_exist_operations: put 0, get_size = len, get = value,
    put of the same key again 0, remove after the lease 0."""
    data = b"Hello, World!"
    assert store.put("test_basic_key", data) == OK
    assert store.get_size("test_basic_key") == len(data)
    assert store.get("test_basic_key") == data
    assert store.put("test_basic_key", data) == OK
    assert _remove_after_lease(store, "test_basic_key") == OK


def test_batch_is_exist_mixed_empty_single_missing(store):
    """test_batch_is_exist_operations: 20 keys, first half put: [1]*10 +
    [0]*10; [] -> []; one present -> [1]; one missing -> [0]; removes after
    the lease succeed."""
    keys = [f"test_batch_exist_key_{i}" for i in range(20)]
    for k in keys[:10]:
        assert store.put(k, b"Hello, Batch World!") == OK
    assert store.batch_is_exist(keys) == [1] * 10 + [0] * 10
    assert store.batch_is_exist([]) == []
    assert store.batch_is_exist([keys[0]]) == [1]
    assert store.batch_is_exist(["non_existent_key"]) == [0]
    for k in keys[:10]:
        assert _remove_after_lease(store, k) == OK


def test_zero_copy_put_from_get_into_small_buffer_unregister(store):
    """test_zero_copy_operations: register_buffer 0 (and without it in the CXL
    file), put_from 0, get == data, get_into returns the byte count and the
    bytes, a buffer of half the size gives a negative result,
    unregister_buffer 0, remove after the lease 0."""
    data = b"Hello, Zero-Copy World! " * 1000
    buf = (ctypes.c_ubyte * (len(data) + 1024))()
    ptr = ctypes.addressof(buf)
    assert store.register_buffer(ptr, len(data) + 1024) == OK
    ctypes.memmove(buf, data, len(data))
    assert store.put_from("test_zero_copy_key", ptr, len(data)) == OK
    assert store.get("test_zero_copy_key") == data
    ctypes.memset(buf, 0, len(data) + 1024)
    n = store.get_into("test_zero_copy_key", ptr, len(data) + 1024)
    assert n == len(data) and bytes(buf[:n]) == data
    small = (ctypes.c_ubyte * (len(data) // 2))()
    sptr = ctypes.addressof(small)
    assert store.register_buffer(sptr, len(data) // 2) == OK
    assert store.get_into("test_zero_copy_key", sptr, len(data) // 2) < 0
    unreg = (ctypes.c_ubyte * (len(data) // 2))()  # the CXL file: no registration
    assert store.get_into("test_zero_copy_key", ctypes.addressof(unreg), len(data) // 2) < 0
    assert store.unregister_buffer(ptr) == OK and store.unregister_buffer(sptr) == OK
    assert _remove_after_lease(store, "test_zero_copy_key") == OK


def test_get_into_ranges_buffer_major_and_error_shapes(store):
    """test_get_into_ranges_operations: two registered 32-byte buffers, keys
    per buffer, results [[[4, 3], [5]], [[6], [4]]] and the bytes at their
    offsets; a key whose ranges mismatch gets [negative] and a key given no
    ranges gets []; a source or destination overflow is negative; a missing
    key is negative while the next key of the buffer reads 4 bytes."""
    d1, d2 = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"abcdefghijklmnopqrstuvwxyz0123456789"
    assert store.put("k1", d1) == OK and store.put("k2", d2) == OK
    b0, b1 = (ctypes.c_ubyte * 32)(), (ctypes.c_ubyte * 32)()
    p0, p1 = ctypes.addressof(b0), ctypes.addressof(b1)
    assert store.register_buffer(p0, 32) == OK and store.register_buffer(p1, 32) == OK
    ctypes.memset(b0, ord("_"), 32)
    ctypes.memset(b1, ord("_"), 32)
    r = store.get_into_ranges([p0, p1], [["k1", "k2"], ["k2", "k1"]], [[[0, 20], [8]], [[4], [16]]],
                              [[[1, 30], [2]], [[0], [10]]], [[[4, 3], [5]], [[6], [4]]])
    assert r == [[[4, 3], [5]], [[6], [4]]]
    assert bytes(b0[0:4]) == d1[1:5] and bytes(b0[8:13]) == d2[2:7] and bytes(b0[20:23]) == d1[30:33]
    assert bytes(b1[4:10]) == d2[0:6] and bytes(b1[16:20]) == d1[10:14]
    mismatch = store.get_into_ranges([p0], [["k1", "k2"]], [[[0], []]], [[[0, 1], []]], [[[4, 4], []]])
    assert len(mismatch) == 1 and len(mismatch[0]) == 2
    assert len(mismatch[0][0]) == 1 and mismatch[0][0][0] < 0 and mismatch[0][1] == []
    assert store.get_into_ranges([p0], [["k1"]], [[[0]]], [[[len(d1) - 1]]], [[[4]]])[0][0][0] < 0
    assert store.get_into_ranges([p0], [["k1"]], [[[31]]], [[[0]]], [[[4]]])[0][0][0] < 0
    missing = store.get_into_ranges([p0], [["missing-key", "k1"]], [[[0], [8]]], [[[0], [0]]], [[[4], [4]]])
    assert missing[0][0][0] < 0 and missing[0][1][0] == 4
    assert store.unregister_buffer(p0) == OK and store.unregister_buffer(p1) == OK
    assert _remove_after_lease(store, "k1") == OK and _remove_after_lease(store, "k2") == OK


def _spaced(n, spacing=1 << 20):
    big = (ctypes.c_ubyte * (spacing * n))()
    base = ctypes.addressof(big)
    return big, base, [base + i * spacing for i in range(n)]


def _check_batch_mismatch_empty_cleanup(store, batch_op, keys, ptrs, sizes, base):
    """Shared tail of the batch_get_into / batch_put_from tests: 2 keys with 3
    pointers and sizes -> 2 negative results; [] -> []; then unregister the
    buffer and remove the keys after the lease (0 each)."""
    bad = batch_op(keys[:2], ptrs[:3], sizes)
    assert len(bad) == 2 and all(r < 0 for r in bad)
    assert batch_op([], [], []) == []
    assert store.unregister_buffer(base) == OK
    for k in keys:
        assert _remove_after_lease(store, k) == OK


def test_batch_get_into_one_large_buffer_mismatch_empty(store):
    """test_batch_get_into_operations: three values read into 1 MiB-spaced
    views of one registered buffer (results = lengths, bytes match); 2 keys
    with 3 pointers and sizes -> 2 negative results; [] -> []."""
    data = [b"Hello, Batch World 1! " * 100, b"Hello, Batch World 2! " * 200, b"Hello, Batch World 3! " * 150]
    keys = [f"test_batch_get_into_key_{i}" for i in range(3)]
    for k, d in zip(keys, data):
        assert store.put(k, d) == OK
    big, base, ptrs = _spaced(3)
    assert store.register_buffer(base, 3 << 20) == OK
    assert store.batch_get_into(keys, ptrs, [1 << 20] * 3) == [len(d) for d in data]
    for i, d in enumerate(data):
        assert bytes(big[i << 20:(i << 20) + len(d)]) == d
    _check_batch_mismatch_empty_cleanup(store, store.batch_get_into, keys, ptrs, [1 << 20] * 3, base)


def test_batch_put_from_one_large_buffer_mismatch_empty(store):
    """test_batch_put_from_operations: three values put from 1 MiB-spaced
    views of one registered buffer ([0, 0, 0], get returns each); 2 keys with
    3 pointers -> 2 negative results; [] -> []."""
    data = [b"Batch Put Data 1! " * 100, b"Batch Put Data 2! " * 200, b"Batch Put Data 3! " * 150]
    keys = [f"test_batch_put_from_key_{i}" for i in range(3)]
    big, base, ptrs = _spaced(3)
    for p, d in zip(ptrs, data):
        ctypes.memmove(ctypes.c_void_p(p), d, len(d))
    assert store.register_buffer(base, 3 << 20) == OK
    assert store.batch_put_from(keys, ptrs, [len(d) for d in data]) == [OK] * 3
    for k, d in zip(keys, data):
        assert store.get(k) == d
    _check_batch_mismatch_empty_cleanup(store, store.batch_put_from, keys, ptrs, [len(d) for d in data], base)


def test_concurrent_threads_put_get_remove(store):
    """test_concurrent_stress_with_barrier: 8 threads put their keys, all
    wait, get back exactly their bytes, wait, and remove them after the lease
    (0 each). (The reference: 100 x 1 MiB per thread; here 10 x 256 KiB.)"""
    threads, errors = 8, []
    barrier = threading.Barrier(threads)

    def worker(t):
        try:
            data = os.urandom(256 << 10)
            keys = [f"key_{t}_{i}" for i in range(10)]
            barrier.wait()
            for k in keys:
                assert store.put(k, data) == OK, k
            barrier.wait()
            for k in keys:
                assert store.get(k) == data, k
            barrier.wait()
            for k in keys:
                assert _remove_after_lease(store, k) == OK, k
        except BaseException as e:  # reported below
            errors.append(f"thread {t}: {e!r}")
            barrier.abort()

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors


def test_dict_fuzz_against_a_dict(store):
    """zzz_test_dict_fuzz_e2e: random put/get/remove over a pool of keys; a
    put is 0 (or -200 when full), a non-empty get equals what the dict holds
    (an empty one may be an eviction), a remove other than -706 drops the key.
    (The reference: 1000 ops, values up to 64 MiB; here 400, up to 1 MiB.)"""
    rng = random.Random(7)
    reference, values = {}, {}
    for i in range(400):
        op, key = rng.choice(("put", "get", "remove")), f"key_{rng.randrange(30)}"
        if op == "put":
            value = values.setdefault(key, os.urandom(rng.randint(1, 1 << 20)))
            rc = store.put(key, value)
            assert rc in (OK, NO_SPACE), (i, key, rc)
            if rc == OK:
                reference[key] = value
        elif op == "get":
            got = store.get(key)
            if got != b"":
                assert got == reference.get(key, b""), (i, key)
        else:
            if store.remove(key) != HAS_LEASE:
                reference.pop(key, None)
                values.pop(key, None)


def test_replicate_config_defaults_and_properties():
    """test_replicate_config_creation_and_properties: replica_num 1,
    with_soft_pin False (soft_pin_action PRESERVE in newer files),
    preferred_segment ""; assignments read back; str() names replica_num."""
    c = ReplicateConfig()
    assert c.replica_num == 1 and c.with_soft_pin is False and c.preferred_segment == ""
    assert c.soft_pin_action == SoftPinAction.PRESERVE
    c.replica_num, c.with_soft_pin, c.preferred_segment = 3, True, "node1:12345"
    assert c.replica_num == 3 and c.with_soft_pin is True and c.preferred_segment == "node1:12345"
    c.soft_pin_action = SoftPinAction.ENABLE
    assert c.soft_pin_action == SoftPinAction.ENABLE
    assert isinstance(str(c), str) and "3" in str(c)


def test_batch_get_buffer_then_remove_while_handles_live(store):
    """test_batch_get_buffer_operations: handles of two keys (size() and
    bytes), [present, missing] -> [handle, None], [] -> [], single present /
    missing; then, with every handle still alive, remove() after the lease
    is 0 for both keys (the reference's handles are private copies; ours are
    views whose bytes stay intact until the last one is dropped)."""
    data = [b"Batch Buffer Data 1! " * 100, b"Batch Buffer Data 2! " * 200]
    keys = ["test_batch_get_buffer_key1", "test_batch_get_buffer_key2"]
    for k, d in zip(keys, data):
        assert store.put(k, d) == OK
    results = store.batch_get_buffer(keys)
    assert [h.size() for h in results] == [len(d) for d in data]
    assert [bytes(h) for h in results] == data
    mixed = store.batch_get_buffer([keys[0], "non_existent_key"])
    assert len(mixed) == 2 and bytes(mixed[0]) == data[0] and mixed[1] is None
    assert store.batch_get_buffer([]) == []
    single = store.batch_get_buffer([keys[0]])
    assert len(single) == 1 and single[0] is not None
    assert store.batch_get_buffer(["definitely_non_existent_key"]) == [None]
    for k in keys:
        assert _remove_after_lease(store, k) == OK
        assert store.is_exist(k) == 0
    for k, d in zip(keys, data):  # reuse the space hard: the viewed bytes must not move
        for i in range(40):
            assert store.put(f"{k}-churn{i}", os.urandom(len(d))) in (OK, NO_SPACE)
    assert [bytes(h) for h in results] == data and bytes(mixed[0]) == data[0] and bytes(single[0]) == data[0]


def test_put_get_tensor_dtypes_and_shapes(store):
    """test_put_get_tensor: float32, int32, bool and a random float32 tensor
    round trip with their dtype and values; 2-D float32 and 3-D int64 keep
    their shape (test_put_get_tensor_with_metadata)."""
    torch = pytest.importorskip("torch")
    for key, t in (("f", torch.tensor([1.0, 2.0, 3.0, 4.0])), ("i", torch.tensor([1, 2, 3, 4], dtype=torch.int32)),
                   ("b", torch.tensor([True, False, False, True])), ("r", torch.rand(1000)),
                   ("2d", torch.tensor([[1.0, 2.0], [3.0, 4.0]])),
                   ("3d", torch.tensor([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], dtype=torch.int64))):
        assert store.put_tensor(key, t) == OK
        got = store.get_tensor(key)
        assert got is not None and got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), key


def test_cxl_file_flow_two_test_classes(master_factory, pool_path, monkeypatch):
    """test_distributed_object_store_cxl.py: with MC_CXL_DEV_PATH /
    MC_CXL_DEV_SIZE set and protocol "cxl", each test class opens the pool
    file with O_CREAT (0o666 less the umask), ftruncates it and sets up; its
    teardown closes and unlinks the file while the master runs; the next
    class does the same on a fresh file and its setup must succeed. The file
    the test makes is 0644 with the usual umask: a master that formats a
    world-readable pool needs --allow_world_readable_pool (as for a first
    format); the master here has it."""
    master = master_factory(extra_flags=["--allow_world_readable_pool=true"])
    monkeypatch.setenv("MC_CXL_DEV_PATH", pool_path)
    monkeypatch.setenv("MC_CXL_DEV_SIZE", str(POOL_SIZE))
    old = os.umask(0o022)
    try:
        for cls in range(3):
            fd = os.open(pool_path, os.O_RDWR | os.O_CREAT, 0o666)
            os.ftruncate(fd, POOL_SIZE)
            s = _setup(master, protocol="cxl")
            assert s.get("test_basic_key") == b""  # every class starts from a blank pool
            assert s.put("test_basic_key", b"Hello, World!") == OK
            assert s.get("test_basic_key") == b"Hello, World!"
            assert s.close() == OK
            os.close(fd)
            os.unlink(pool_path)
    finally:
        os.umask(old)


def test_cxl_master_started_before_its_pool_file_exists(master_factory, pool_path, monkeypatch):
    """test_distributed_object_store_cxl.py as Mooncake runs it: the master is
    started with --enable_cxl --cxl_path=<tmp>/tmp_dax_sim --cxl_size=N before
    the test's setUpClass creates that file (the reference master does not
    open the device at start). Ours creates the file itself (0600, N bytes)
    rather than exit (-600, "cannot open pool"), the test's O_CREAT +
    ftruncate(N) open the same file, and after the first class unlinks it the
    next class's fresh file replaces it."""
    from mooncake_cxl import launch
    assert not os.path.exists(pool_path)
    monkeypatch.setattr(launch, "create_pool_file", lambda *a, **k: None)  # start as Mooncake's CI does
    master = master_factory(format=False)
    st = os.stat(pool_path)
    assert st.st_size == POOL_SIZE and st.st_mode & 0o777 == 0o600
    with open(master.log_path, "rb") as f:
        assert b"does not exist: creating it" in f.read()
    monkeypatch.setenv("MC_CXL_DEV_PATH", pool_path)
    monkeypatch.setenv("MC_CXL_DEV_SIZE", str(POOL_SIZE))
    old = os.umask(0o077)
    try:
        for cls in range(2):
            fd = os.open(pool_path, os.O_RDWR | os.O_CREAT, 0o666)
            os.ftruncate(fd, POOL_SIZE)
            s = _setup(master, protocol="cxl")
            assert s.get("test_basic_key") == b""
            assert s.put("test_basic_key", b"Hello, World!") == OK
            assert s.get("test_basic_key") == b"Hello, World!"
            assert s.close() == OK
            os.close(fd)
            os.unlink(pool_path)
    finally:
        os.umask(old)


def test_compat_shim_serves_the_wheels_structured_object_store(tmp_path):
    """test_put_get_tensor.py imports mooncake.structured_object_store (a
    pure-Python client of mooncake.store in the wheel) at module level; had
    that import failed through the shim, none of the file's store tests would
    run. With the wheel installed the shim loads that module from the wheel's
    own file, on top of our mooncake.store; native mooncake.* modules stay
    refused."""
    import importlib.machinery
    import subprocess
    import sys
    pkg = importlib.machinery.PathFinder.find_spec("mooncake")
    locs = list(pkg.submodule_search_locations or []) if pkg else []
    if not locs or importlib.machinery.PathFinder.find_spec("structured_object_store", locs) is None:
        pytest.skip("the reference wheel (with mooncake/structured_object_store.py) is not installed")
    code = (
        "import mooncake.store as ms\n"
        "assert getattr(ms, '__mooncake_cxl_shim__', False)\n"
        "from mooncake.structured_object_store import _choose_leaf_codec, infer_structure, MISSING\n"
        "import mooncake.structured_object_store as so\n"
        "assert so._mooncake_store is ms, so._mooncake_store\n"
        "assert ms.MooncakeDistributedStore.__module__.startswith('mooncake_cxl')\n"
        "assert _choose_leaf_codec([b'a', b'b']).codec == 'bytes_ragged'\n"
        "try:\n"
        "    import mooncake.engine\n"
        "except ModuleNotFoundError as e:\n"
        "    assert 'only mooncake.store' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('mooncake.engine was not refused')\n"
        "print('ok')\n")
    env = dict(os.environ, MOONCAKE_CXL_COMPAT="1")
    # cwd outside the checkout: `-c` puts the cwd first on sys.path (the
    # installed package is what is tested).
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                       cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_reference_tenant_flags_accepted(master_factory):
    """mooncake_master 0.3.13's tenant flags (--enable_multi_tenants,
    --quota_bytes, --tenant_quota_connector_type/_uri, --kv_events_tenant_id)
    start our master too (not "unknown flag"): isolation is
    always on here, quotas are not enforced, each is said in one log line."""
    master = master_factory(extra_flags=["--enable_multi_tenants=true", "--quota_bytes=1073741824",
                                         "--tenant_quota_connector_type=file",
                                         "--tenant_quota_connector_uri=/nonexistent/quota.json",
                                         "--kv_events_tenant_id=default"])
    a, b = MooncakeDistributedStore(), MooncakeDistributedStore()
    for s, tenant in ((a, "A"), (b, "B")):
        assert s.setup("localhost", "P2PHANDSHAKE", 0, 0, "cxl", "", master.address, tenant_id=tenant) == OK
    try:
        assert a.put("k", b"a's") == OK
        assert b.get("k") == b"" and a.get("k") == b"a's"
    finally:
        a.close(), b.close()
    with open(master.log_path, "rb") as f:
        log = f.read()
    assert b"--enable_multi_tenants=true: tenants are always isolated here" in log
    for flag in (b"quota_bytes", b"tenant_quota_connector_type", b"tenant_quota_connector_uri",
                 b"kv_events_tenant_id"):
        assert b"--" + flag + b" accepted for Mooncake compatibility" in log
