"""The pool is memory every client can write: one bad 8-byte store into an
index entry or object header (a bogus object_offset, value_size or key_len)
must not crash the master or other clients; a corrupt superblock must make a
new client's setup fail with a clear code; a pool file that shrinks under a
running master and clients must stop the master with a clear message and
turn the clients' calls into errors, not SIGBUS deaths.

Every corruption is made by a separate process through its own mmap of the
pool file (offsets from _core._layout(), i.e. layout.h); the readers are
other processes, over the CXL RPC rings and over TCP."""
import multiprocessing as mp
import os
import urllib.request

import pytest

from conftest import connect, metric, wait_until
from pool_workers import corrupter, layout, reader, setup_code, shrink_victim, superblock_write, value_for

CTX = mp.get_context("spawn")
TIMEOUT = 120


def all_keys(master):
    with urllib.request.urlopen(master.metrics_url + "/get_all_keys", timeout=10) as r:
        assert r.status == 200
        body = r.read().decode()
    return set(body.split("\n")) - {""}


def run(target, *args):
    q = CTX.Queue()
    p = CTX.Process(target=target, args=args + (q,))
    p.start()
    return p, q


def finish(p, timeout=60):
    p.join(timeout)
    assert p.exitcode == 0, f"client process died: exit {p.exitcode}"


@pytest.mark.parametrize("field,value", [
    ("object_offset", 1 << 62),         # far outside the pool
    ("object_offset", 64),              # inside the superblock
    ("value_size", 1 << 60),            # a value larger than any pool
    ("key_len", 0xFFFFFFFF),            # a header key 4 GiB long
], ids=["offset-huge", "offset-superblock", "value-size", "key-len"])
def test_one_bad_store_in_the_pool_crashes_nothing(master, pool_path, field, value):
    s = connect(master)
    keys = [f"k/{i}" for i in range(40)]
    victim = "victim"
    try:
        for k in keys + [victim]:
            assert s.put(k, value_for(k)) == 0
        p, q = run(corrupter, pool_path, victim, field, value)
        assert q.get(timeout=TIMEOUT) == "corrupted"
        finish(p)

        # The master lists every other key, never dereferences the bad one.
        listed = all_keys(master)
        assert victim not in listed
        assert set(keys) <= listed
        assert metric(master, "mooncake_cxl_corrupt_entries_total") >= 1

        # Other clients, over rings and TCP: intact keys read back, the
        # corrupt one is a miss (not an exception, not foreign bytes), puts work.
        readers = [run(reader, master.address, t, keys, victim) for t in ("ring", "tcp")]
        for p, q in readers:
            bad, vget, vexist, vview_none, puts = q.get(timeout=TIMEOUT)
            finish(p)
            assert bad == []
            assert vget == b""
            assert vexist != 1
            assert vview_none
            assert puts == [0] * 20
        assert master.proc.poll() is None, master.log_tail()

        # Reclaimed by the master: the key can be put again and reads back.
        assert s.put(victim, b"fresh" * 100) == 0
        assert s.get(victim) == b"fresh" * 100
        assert s.remove_all(force=True) == len(keys) + 40 + 1
        # Nothing leaked: the corrupt entry's extent was freed by the
        # master's own handle (at most one Tick after it was found).
        wait_until(lambda: metric(master, "master_allocated_bytes") == 0,
                   "the corrupt entry's extent to be freed", master=master)
        assert master.proc.poll() is None, master.log_tail()
        assert "is corrupt" in master.log_tail(20000)
    finally:
        s.close()


def test_a_corrupt_superblock_fails_a_new_clients_setup(master, pool_path):
    s = connect(master)
    try:
        assert s.put("sb/0", value_for("sb/0")) == 0
        lay = layout()
        import mmap
        import struct
        with open(pool_path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            data_offset = struct.unpack_from("<Q", mm, lay["superblock.data_offset"])[0]
            mm.close()
        for field, value in [("index_capacity", 1 << 58), ("data_size", (1 << 64) - data_offset),
                             ("pool_size", 1 << 40)]:
            old = superblock_write(pool_path, field, value)
            try:
                p, q = run(setup_code, master.address)
                rc, _ = q.get(timeout=TIMEOUT)
                finish(p)
                assert rc == -600, (field, rc)  # INVALID_PARAMS; the log names the field
                # The running master and client keep their verified copy.
                assert s.get("sb/0") == value_for("sb/0")
                assert s.put(f"sb/{field}", b"v" * 5000) == 0
                assert master.proc.poll() is None, master.log_tail()
            finally:
                superblock_write(pool_path, field, old)
        p, q = run(setup_code, master.address)
        assert q.get(timeout=TIMEOUT) == (0, True)
        finish(p)
    finally:
        s.close()


def test_shrinking_the_pool_stops_the_master_and_fails_clients_cleanly(master, pool_path):
    s = connect(master)
    keys = [f"big/{i}" for i in range(40)]
    for k in keys:
        assert s.put(k, value_for(k, 64 << 10)) == 0
    s.close()
    victims = [run(shrink_victim, master.address, t, keys) for t in ("ring", "tcp")]
    for _, q in victims:
        assert q.get(timeout=TIMEOUT) == "ready"
    size = os.path.getsize(pool_path)
    os.truncate(pool_path, 4 << 20)  # below the index and the data region
    try:
        code = master.proc.wait(timeout=30)
    except Exception:
        raise AssertionError("the master kept running on a shrunk pool: " + master.log_tail())
    log = master.log_tail(20000)
    assert code == 3, log  # kPoolLostExitCode, not a SIGBUS death (-7)
    # From Tick's size check, or from the SIGBUS handler when a thread
    # touched the lost pages first: the same words either way.
    assert f"pool device shrank from {size} to {4 << 20} bytes" in log, log
    for p, q in victims:
        r = q.get(timeout=TIMEOUT)
        finish(p)
        assert r["get"] == b""
        assert r["is_exist"] == -1010
        assert r["get_size"] == -1010
        assert r["put"] == -1010
        assert r["view"]
