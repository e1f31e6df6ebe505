"""Dummy clients and the standalone client: a master, a
`mooncake_cxl_client` process, and dummy clients in other processes attached
with setup_dummy(mem_pool_size, local_buffer_size, "host:port").

The second half pins the behaviours Mooncake's own
mooncake-wheel/tests/test_dummy_client.py checks through a dummy client (one
test per behaviour, named after it); ours are written from scratch.
"""
import ctypes
import json
import logging
import os
import socket
import subprocess
import sys
import threading

import pytest

import mooncake_cxl
import oracle
from conftest import connect, value_for, wait_for_leases_to_lapse
from mooncake_cxl import MooncakeDistributedStore
from mooncake_cxl.launch import StandaloneClientProcess

RPC_FAIL = -900
INVALID = -600
LEASE_MS = 100  # the master's --default_kv_lease_ttl here: removes after a get wait for it


@pytest.fixture
def lease_master(master_factory):
    return master_factory(extra_flags=[f"--default_kv_lease_ttl={LEASE_MS}"])


@pytest.fixture
def standalone(lease_master, tmp_path):
    c = StandaloneClientProcess(lease_master.address, extra_flags=["--protocol=cxl"],
                                log_path=str(tmp_path / "standalone.log")).start()
    yield c
    c.stop()


@pytest.fixture
def dummy(standalone):
    s = MooncakeDistributedStore()
    assert s.setup_dummy(64 << 20, 16 << 20, standalone.address) == 0, standalone.log_tail()
    yield s
    s.close()




# ------------------------------------------------------------------ processes

def dummy_worker(conn, server_address, reader_key):
    """A dummy client in its own process: setup_dummy, puts from an
    alloc_from_mem_pool buffer, reads a normal client's key into it."""
    s = MooncakeDistributedStore()
    rc = s.setup_dummy(3200 << 20, 512 << 20, server_address)
    if rc != 0:
        return {"setup": rc}
    out = {"setup": rc, "hostname": s.get_hostname()}
    out["put"] = s.put("dummy/plain", value_for("dummy/plain", 10_000))
    size = 1 << 20
    ptr = s.alloc_from_mem_pool(2 * size)
    out["ptr_nonzero"] = ptr != 0
    out["register"] = s.register_buffer(ptr, 2 * size)  # as the reference's callers do
    data = value_for("dummy/from", 300_000)
    ctypes.memmove(ptr, data, len(data))
    out["put_from"] = s.put_from("dummy/from", ptr, len(data))
    out["get_into"] = s.get_into(reader_key, ptr + size, size)
    out["read"] = ctypes.string_at(ptr + size, max(out["get_into"], 0))
    out["batch_get_into"] = s.batch_get_into(["dummy/plain", "dummy/from"], [ptr, ptr + size],
                                             [size, size])
    out["batch_ok"] = (ctypes.string_at(ptr, 10_000) == value_for("dummy/plain", 10_000) and
                       ctypes.string_at(ptr + size, len(data)) == data)
    h = s.get_buffer("dummy/from")
    out["get_buffer"] = h is not None and bytes(memoryview(h)) == data
    del h
    out["unregister"] = s.unregister_buffer(ptr)
    s.close()
    return out


def test_dummy_in_another_process_puts_and_reads_and_a_normal_client_sees_its_keys(
        lease_master, standalone, children):
    normal = connect(lease_master)
    try:
        assert normal.put("normal/k", value_for("normal/k", 50_000)) == 0
        out = children(dummy_worker, standalone.address, "normal/k").result()
        assert out["setup"] == 0
        assert out["hostname"].rsplit(":", 1)[1].isdigit()
        assert out["put"] == 0 and out["ptr_nonzero"] and out["register"] == 0
        assert out["put_from"] == 0
        assert out["get_into"] == 50_000 and out["read"] == value_for("normal/k", 50_000)
        assert out["batch_get_into"] == [10_000, 300_000] and out["batch_ok"]
        assert out["get_buffer"] and out["unregister"] == 0
        # The dummy's keys outlive it, and a normal client reads them without it.
        assert normal.get("dummy/plain") == value_for("dummy/plain", 10_000)
        assert normal.get("dummy/from") == value_for("dummy/from", 300_000)
    finally:
        normal.close()


def test_dummy_data_path_does_not_go_through_the_standalone_client(dummy, standalone, lease_master):
    # The standalone client only relays configuration: killed, the dummy still
    # puts, reads and removes (it maps the pool and talks to the master itself).
    assert dummy.put("before", b"x" * 1000) == 0
    standalone.kill()
    assert dummy.put("after", b"y" * 1000) == 0
    assert dummy.get("before") == b"x" * 1000 and dummy.get("after") == b"y" * 1000
    wait_for_leases_to_lapse(lease_master)
    assert dummy.remove("before") == 0 and dummy.is_exist("before") == 0
    normal = connect(lease_master)
    try:
        assert normal.get("after") == b"y" * 1000
    finally:
        normal.close()


def test_setup_dummy_with_no_standalone_client_returns_rpc_fail(caplog, standalone):
    s = MooncakeDistributedStore()
    port = oracle.free_port()
    with caplog.at_level(logging.ERROR, logger="mooncake_cxl"):
        assert s.setup_dummy(1 << 20, 1 << 20, f"127.0.0.1:{port}") == RPC_FAIL
    msgs = [r.getMessage() for r in caplog.records if r.name == "mooncake_cxl"]
    assert len(msgs) == 1 and f"127.0.0.1:{port}" in msgs[0] and "mooncake_cxl_client" in msgs[0]
    assert s.health_check() == 1  # not set up
    assert s.alloc_from_mem_pool(4096) == 0  # no memory before a setup
    # The failure leaves the store usable: the next setup_dummy works.
    assert s.setup_dummy(1 << 20, 1 << 20, standalone.address) == 0
    assert s.put("k", b"v") == 0 and s.get("k") == b"v"
    s.close()


def test_standalone_client_gone_after_start_returns_rpc_fail(standalone):
    standalone.stop()
    s = MooncakeDistributedStore()
    assert s.setup_dummy(1 << 20, 1 << 20, standalone.address) == RPC_FAIL


def test_setup_dummy_rejects_malformed_arguments():
    s = MooncakeDistributedStore()
    for bad in ("127.0.0.1", "127.0.0.1:", ":50052", "127.0.0.1:0", "127.0.0.1:70000", "h:p"):
        assert s.setup_dummy(1 << 20, 1 << 20, bad) == INVALID, bad
    for sizes in ((-1, 0), (0, -1), (1.5, 0)):
        with pytest.raises(TypeError):
            s.setup_dummy(*sizes, "127.0.0.1:50052")
    assert s.health_check() == 1


class FakeStandalone:
    """A server on 127.0.0.1 that answers every connection with `reply` bytes."""

    def __init__(self, reply):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.reply = reply
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(4096)
                    conn.sendall(self.reply)
                except OSError:
                    pass

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("reply", [
    b"not json\n",
    b"[1, 2]\n",
    b'{"ok": false, "error": "nope"}\n',
    b'{"ok": true, "v": 1}\n',                                    # names no master
    b'{"ok": true, "master_server_addr": 5, "protocol": "cxl"}\n',
    b'{"ok": true, "master_server_addr": "127.0.0.1:1", "protocol": "pigeon"}\n',
    b'{"ok": true, "master_server_addr": "127.0.0.1:1", "pool_size": -1}\n',
    b'{"ok": true, "master_server_addr": "' + b"a" * 70000 + b'"}\n',  # longer than the reply limit
    b'{"ok": true',                                               # closed mid-reply
], ids=["not-json", "not-object", "error", "no-master", "bad-type", "bad-protocol",
        "bad-size", "too-long", "truncated"])
def test_setup_dummy_refuses_a_garbage_answer(reply):
    fake = FakeStandalone(reply)
    try:
        s = MooncakeDistributedStore()
        assert s.setup_dummy(1 << 20, 1 << 20, fake.address) == RPC_FAIL
        assert s.health_check() == 1
    finally:
        fake.close()


def _raw(address, payload, timeout=10):
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as c:
        c.sendall(payload)
        data = b""
        while b"\n" not in data:
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def test_standalone_service_is_bounded_and_survives_garbage(standalone):
    assert json.loads(_raw(standalone.address, b"x" * 10_000))["ok"] is False  # no newline, too long
    assert json.loads(_raw(standalone.address, b"\xff\xfe\n"))["ok"] is False
    assert json.loads(_raw(standalone.address, b'{"op": "format_pool"}\n'))["ok"] is False
    # A silent connection is closed by the server, not held forever.
    host, port = standalone.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as c:
        assert c.recv(10) == b""
    # Many connections at once: the service keeps answering afterwards.
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(40)]
    for c in held:
        c.close()
    cfg = json.loads(_raw(standalone.address, b'{"op": "config", "v": 1}\n'))
    assert cfg["ok"] is True and cfg["master_server_addr"] == standalone.master_address
    assert "token" not in json.dumps(cfg)  # the pool's credential never leaves the pool
    assert standalone.proc.poll() is None


def _client_cmd(*flags):
    return [sys.executable, "-c", "import sys; from mooncake_cxl.standalone import main; "
            "sys.exit(main())", *flags]


def _run_client(*flags, timeout=60):
    env = dict(os.environ, MC_CXL_CONNECT_TIMEOUT_MS="500")
    here = os.path.dirname(os.path.dirname(os.path.abspath(mooncake_cxl.__file__)))  # not the source tree
    return subprocess.run(_client_cmd(*flags), capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=here)


def test_standalone_client_flags_are_mooncakes():
    out = _run_client("--help").stdout
    for flag in ("--host", "--port", "--master_server_address", "--protocol", "--device_names",
                 "--metadata_server", "--global_segment_size", "--local_buffer_size", "--threads",
                 "--enable_offload", "--start_offload_rpc_server", "--tenant_id"):
        assert flag in out, flag
    bad = _run_client("--global_segment_size=lots")
    assert bad.returncode == 2 and "global_segment_size" in bad.stderr
    bad = _run_client("--bogus_flag=1")
    assert bad.returncode == 2


def test_standalone_client_without_a_master_exits_with_a_message():
    r = _run_client(f"--master_server_address=127.0.0.1:{oracle.free_port()}", "--port=0")
    assert r.returncode == 1 and "setup against the master" in r.stderr


def test_standalone_client_takes_gflags_spellings(lease_master, tmp_path):
    # Mooncake's flags are gflags: -flag value, --flag=value, --noflag.
    c = StandaloneClientProcess(lease_master.address,
                                extra_flags=["-protocol", "tcp", "--noenable_offload",
                                             "-global_segment_size", "4 GB", "--host=node7",
                                             "--tenant_id=t1"],
                                log_path=str(tmp_path / "c.log")).start()
    try:
        cfg = json.loads(_raw(c.address, b'{"op": "config"}\n'))
        assert cfg["protocol"] == "tcp" and cfg["host"] == "node7" and cfg["tenant_id"] == "t1"
        s = MooncakeDistributedStore()
        assert s.setup_dummy(0, 0, c.address) == 0
        assert s.get_hostname().startswith("node7:")
        s.close()
    finally:
        c.stop()


def test_init_all_sets_up_against_the_local_master(lease_master, monkeypatch, caplog):
    monkeypatch.setenv("MC_CXL_MASTER_ADDR", lease_master.address)
    s = MooncakeDistributedStore()
    assert s.init_all("tcp", "", 16 << 20) == 0
    assert s.put("ia", b"v") == 0 and s.get("ia") == b"v"
    with caplog.at_level(logging.ERROR, logger="mooncake_cxl"):
        assert s.init_all("tcp", "") == INVALID  # the reference: "already initialized"
    assert any("already set up" in r.getMessage() for r in caplog.records)
    s.close()
    assert s.init_all("carrier-pigeon", "") == INVALID


def test_alloc_from_mem_pool_memory_is_registered_and_bounded(dummy):
    assert dummy.alloc_from_mem_pool(0) == 0
    p = dummy.alloc_from_mem_pool(8192)
    q = dummy.alloc_from_mem_pool(8192)
    assert p and q and p != q and abs(p - q) >= 8192  # distinct regions
    ctypes.memset(p, 0x5A, 8192)
    ctypes.memset(q, 0x33, 8192)  # both writable, zero-filled at first, independent
    assert ctypes.string_at(p, 8192) == b"\x5a" * 8192
    assert dummy.register_buffer(p, 8192) == 0 and dummy.register_buffer(p, 8192) == 0
    assert dummy.put("big", b"z" * 20000) == 0
    # Registered automatically: a read that would run past the region is refused.
    assert dummy.get_into("big", p, 20000) == INVALID
    assert dummy.get_into("big", p + 4096, 4096) == INVALID  # too small for 20000 bytes
    assert dummy.unregister_buffer(p) == 0 and dummy.unregister_buffer(p) == INVALID
    assert dummy.register_buffer(p, 8192) == 0


# ------------------------------------- behaviours of Mooncake's test_dummy_client.py

def test_ref_dummy_basic_put_get_exist_put_again_and_remove_after_lease(dummy, lease_master):
    assert dummy.put("basic", b"Hello, World!") == 0
    assert dummy.get_size("basic") == 13 and dummy.get("basic") == b"Hello, World!"
    assert dummy.is_exist("basic") == 1
    assert dummy.put("basic", b"Hello, World!") == 0  # same key again: success
    wait_for_leases_to_lapse(lease_master)
    assert dummy.remove("basic") == 0 and dummy.is_exist("basic") == 0


def test_ref_dummy_batch_is_exist_mixed_empty_single_missing(dummy, lease_master):
    keys = [f"bie/{i}" for i in range(20)]
    for k in keys[:10]:
        assert dummy.put(k, b"Hello, Batch World!") == 0
    assert dummy.batch_is_exist(keys) == [1] * 10 + [0] * 10
    assert dummy.batch_is_exist([]) == []
    assert dummy.batch_is_exist([keys[0]]) == [1]
    assert dummy.batch_is_exist(["non_existent_key"]) == [0]
    wait_for_leases_to_lapse(lease_master)
    assert all(dummy.remove(k) == 0 for k in keys[:10])


def test_ref_dummy_get_into_ranges_two_mem_pool_buffers(dummy, lease_master):
    d1 = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    d2 = b"abcdefghijklmnopqrstuvwxyz0123456789"
    assert dummy.put("r1", d1) == 0 and dummy.put("r2", d2) == 0
    b0, b1 = dummy.alloc_from_mem_pool(32), dummy.alloc_from_mem_pool(32)
    assert dummy.register_buffer(b0, 32) == 0 and dummy.register_buffer(b1, 32) == 0
    ctypes.memset(b0, ord("_"), 32)
    ctypes.memset(b1, ord("_"), 32)
    got = dummy.get_into_ranges([b0, b1], [["r1", "r2"], ["r2", "r1"]],
                                [[[0, 20], [8]], [[4], [16]]], [[[2, 30], [10]], [[0], [12]]],
                                [[[4, 3], [6]], [[6], [4]]])
    assert got == [[[4, 3], [6]], [[6], [4]]]
    buf0, buf1 = ctypes.string_at(b0, 32), ctypes.string_at(b1, 32)
    assert buf0[0:4] == d1[2:6] and buf0[8:14] == d2[10:16] and buf0[20:23] == d1[30:33]
    assert buf1[4:10] == d2[0:6] and buf1[16:20] == d1[12:16]
    # A source range past the value, a destination past the buffer, a missing key: negative.
    assert dummy.get_into_ranges([b0], [["r1"]], [[[0]]], [[[len(d1) - 1]]], [[[4]]])[0][0][0] < 0
    assert dummy.get_into_ranges([b0], [["r1"]], [[[30]]], [[[0]]], [[[4]]])[0][0][0] < 0
    miss = dummy.get_into_ranges([b0], [["missing-key", "r1"]], [[[0], [8]]], [[[0], [0]]],
                                 [[[4], [4]]])
    assert miss[0][0][0] < 0 and miss[0][1][0] == 4
    # Ranges that do not match for one key: a negative code for it (the exact
    # shape of the others is pinned in test_conformance).
    mism = dummy.get_into_ranges([b0], [["r1", "r2"]], [[[0], []]], [[[0, 1], []]], [[[4, 4], []]])
    assert len(mism) == 1 and len(mism[0]) == 2 and mism[0][0][0] < 0
    wait_for_leases_to_lapse(lease_master)
    assert dummy.unregister_buffer(b0) == 0 and dummy.unregister_buffer(b1) == 0
    assert dummy.remove("r1") == 0 and dummy.remove("r2") == 0


def _spaced_buffer(dummy, n, spacing=1 << 20):
    base = dummy.alloc_from_mem_pool(n * spacing)
    assert base and dummy.register_buffer(base, n * spacing) == 0
    return base, [base + i * spacing for i in range(n)]


def test_ref_dummy_batch_get_into_one_large_buffer_mismatch_and_empty(dummy, lease_master):
    data = [b"Hello, Batch World 1! " * 100, b"Hello, Batch World 2! " * 200,
            b"Hello, Batch World 3! " * 150]
    keys = [f"bgi/{i}" for i in range(3)]
    for k, d in zip(keys, data):
        assert dummy.put(k, d) == 0
    base, ptrs = _spaced_buffer(dummy, 3)
    assert dummy.batch_get_into(keys, ptrs, [1 << 20] * 3) == [len(d) for d in data]
    assert all(ctypes.string_at(p, len(d)) == d for p, d in zip(ptrs, data))
    bad = dummy.batch_get_into(keys[:2], ptrs, [1 << 20] * 3)  # mismatched lengths
    assert len(bad) == 2 and all(r < 0 for r in bad)
    assert dummy.batch_get_into([], [], []) == []
    wait_for_leases_to_lapse(lease_master)
    assert dummy.unregister_buffer(base) == 0
    assert all(dummy.remove(k) == 0 for k in keys)


def test_ref_dummy_batch_put_from_one_large_buffer_mismatch_and_empty(dummy, lease_master):
    data = [b"Batch Put Data 1! " * 100, b"Batch Put Data 2! " * 200, b"Batch Put Data 3! " * 150]
    keys = [f"bpf/{i}" for i in range(3)]
    base, ptrs = _spaced_buffer(dummy, 3)
    for p, d in zip(ptrs, data):
        ctypes.memmove(p, d, len(d))
    assert dummy.batch_put_from(keys, ptrs, [len(d) for d in data]) == [0, 0, 0]
    assert [dummy.get(k) for k in keys] == data
    bad = dummy.batch_put_from(keys[:2], ptrs, [len(d) for d in data])
    assert len(bad) == 2 and all(r < 0 for r in bad)
    assert dummy.batch_put_from([], [], []) == []
    wait_for_leases_to_lapse(lease_master)
    assert dummy.unregister_buffer(base) == 0
    assert all(dummy.remove(k) == 0 for k in keys)


def test_ref_dummy_tensor_round_trips_through_mem_pool_buffer(dummy):
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert dummy.put_tensor("tk", t) == 0
    assert torch.equal(dummy.get_tensor("tk"), t)
    size = dummy.get_size("tk")
    ptr = dummy.alloc_from_mem_pool(size)
    assert ptr and dummy.register_buffer(ptr, size) == 0
    ctypes.memset(ptr, 0, size)
    assert torch.equal(dummy.get_tensor_into("tk", ptr, size), t)
    bad = dummy.batch_get_tensor_into(["tk", "tk_missing_arg"], [ptr], [size])
    assert len(bad) == 2 and all(r < 0 for r in bad)
    assert dummy.put_tensor_from("tk_from", ptr, size) == 0
    assert torch.equal(dummy.get_tensor("tk_from"), t)
    assert dummy.batch_put_tensor(["tb0", "tb1"], [t, t + 1]) == [0, 0]
    assert all(torch.equal(a, b) for a, b in zip(dummy.batch_get_tensor(["tb0", "tb1"]), [t, t + 1]))
    assert dummy.put_tensor_with_tp("ttp", t, tp_size=2, split_dim=1) == 0
    for rank, shard in enumerate(torch.chunk(t, 2, dim=1)):
        assert torch.equal(dummy.get_tensor_with_tp("ttp", tp_rank=rank, tp_size=2),
                           shard.contiguous())
    assert dummy.unregister_buffer(ptr) == 0


def test_ref_dummy_concurrent_put_and_put_tensor_threads(dummy):
    # Regular puts and tensor puts from two threads of one dummy client.
    torch = pytest.importorskip("torch")
    n = 16
    values = [f"regular-payload-{i}-".encode() * 4096 for i in range(n)]
    tensors = [(torch.arange(4096, dtype=torch.float32) + i).reshape(64, 64) for i in range(n)]
    errors, start = [], threading.Event()

    def puts():
        start.wait()
        errors.extend(f"put {i}: {rc}" for i, v in enumerate(values)
                      if (rc := dummy.put(f"mix/r{i}", v)) != 0)

    def tensor_puts():
        start.wait()
        errors.extend(f"put_tensor {i}: {rc}" for i, t in enumerate(tensors)
                      if (rc := dummy.put_tensor(f"mix/t{i}", t)) != 0)

    threads = [threading.Thread(target=puts), threading.Thread(target=tensor_puts)]
    for th in threads:
        th.start()
    start.set()
    for th in threads:
        th.join(120)
    assert errors == []
    assert all(dummy.get(f"mix/r{i}") == v for i, v in enumerate(values))
    assert all(torch.equal(dummy.get_tensor(f"mix/t{i}"), t) for i, t in enumerate(tensors))


def test_ref_dummy_concurrent_puts_from_threads_without_torch(dummy):
    # The same regression without torch: two threads of one dummy put at once
    # (one by value, one from an alloc_from_mem_pool buffer); every value intact.
    n = 16
    ptr = dummy.alloc_from_mem_pool(n * 4096)
    for i in range(n):
        ctypes.memmove(ptr + i * 4096, value_for(f"mixb/f{i}", 4096), 4096)
    errors, start = [], threading.Event()

    def puts():
        start.wait()
        errors.extend(rc for i in range(n) if (rc := dummy.put(f"mixb/p{i}",
                                                               value_for(f"mixb/p{i}", 16384))))

    def puts_from():
        start.wait()
        errors.extend(rc for i in range(n) if (rc := dummy.put_from(f"mixb/f{i}", ptr + i * 4096,
                                                                    4096)))

    threads = [threading.Thread(target=puts), threading.Thread(target=puts_from)]
    for th in threads:
        th.start()
    start.set()
    for th in threads:
        th.join(120)
    assert errors == []
    assert all(dummy.get(f"mixb/p{i}") == value_for(f"mixb/p{i}", 16384) for i in range(n))
    assert all(dummy.get(f"mixb/f{i}") == value_for(f"mixb/f{i}", 4096) for i in range(n))


def test_dummy_maps_the_pool_under_the_standalone_clients_name_for_it(
        lease_master, pool_path, tmp_path, monkeypatch):
    # This host's name for the pool (MC_CXL_DEV_PATH with protocol=cxl) is
    # relayed: a dummy without that variable maps the path the standalone
    # client names; its own MC_CXL_DEV_PATH, when set, wins.
    link = f"{pool_path}.link"
    os.symlink(pool_path, link)
    env = dict(os.environ, MC_CXL_DEV_PATH=link)
    c = StandaloneClientProcess(lease_master.address, extra_flags=["--protocol=cxl"], env=env,
                                log_path=str(tmp_path / "c.log")).start()
    try:
        assert json.loads(_raw(c.address, b'{"op": "config"}\n'))["pool_path"] == link
        monkeypatch.delenv("MC_CXL_DEV_PATH", raising=False)
        os.unlink(link)  # the relayed name now leads nowhere
        s = MooncakeDistributedStore()
        assert s.setup_dummy(0, 0, c.address) < 0 and s.health_check() == 1
        monkeypatch.setenv("MC_CXL_DEV_PATH", pool_path)  # the dummy's own name for it wins
        assert s.setup_dummy(0, 0, c.address) == 0
        s.close()
        monkeypatch.delenv("MC_CXL_DEV_PATH")
        os.symlink(pool_path, link)
        assert s.setup_dummy(0, 0, c.address) == 0 and s.put("via-link", b"v") == 0
        s.close()
    finally:
        c.stop()
        if os.path.lexists(link):
            os.unlink(link)
