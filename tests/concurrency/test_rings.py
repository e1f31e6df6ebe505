"""The CXL RPC control path: many clients over the rings at once, a client
killed mid-request, garbage written into the rings, and reclaim of a dead
client's slot. (The whole API suite also runs over rings and over TCP: see
the `transport` fixture; restarts are in faults/test_recovery.py.)"""
import multiprocessing as mp
import os
import mmap
import struct

from conftest import connect, metric, wait_until
from mooncake_cxl import _core
from ring_workers import attached_then_sleep, hammer_then_wait, put_remove_worker

CTX = mp.get_context("spawn")


def client_count(master):
    return metric(master, "master_client_count")


def test_eight_clients_put_and_remove_concurrently_over_rings(master):
    n = 150
    q = CTX.Queue()
    procs = [CTX.Process(target=put_remove_worker, args=(master.address, w, n, q)) for w in range(8)]
    for p in procs:
        p.start()
    results = [q.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    s = connect(master)
    try:
        for wid, puts, removes, again in results:
            assert puts == [0] * n, f"worker {wid}: lost puts {puts}"
            assert removes == [0] * len(removes), f"worker {wid}: removes {removes}"
            assert again == [-704] * len(again), f"worker {wid}: a remove was applied twice?"
            for i in range(n):
                want = b"" if i % 2 == 0 else f"w{wid}/v{i}".encode() * 10
                assert s.get(f"w{wid}/k{i}") == want, (wid, i)
        assert s.remove_all(force=True) == 8 * (n // 2)
    finally:
        s.close()


def test_client_killed_mid_request_does_not_wedge_anyone(master_factory):
    m = master_factory(extra_flags=["--client_ttl=2"])
    q, requests = CTX.Queue(), CTX.Value("q", 0, lock=False)
    p = CTX.Process(target=hammer_then_wait, args=(m.address, q, requests))
    p.start()
    try:
        assert q.get(timeout=60) == "started"
        wait_until(lambda: requests.value >= 200, "the hammering client's first 200 requests")
        p.kill()  # most likely in the middle of a ring request
        p.join(30)
        other = connect(m)
        try:
            for i in range(200):
                assert other.put(f"after/{i}", b"a" * 1000) == 0
                assert other.get(f"after/{i}") == b"a" * 1000
            # The dead client's slot (and its rings) are reclaimed.
            wait_until(lambda: client_count(m) == 1, "the dead client's slot to be reclaimed", master=m)
        finally:
            other.close()
    finally:
        if p.is_alive():
            p.kill()


def test_silent_client_is_reclaimed_after_client_ttl(master_factory):
    m = master_factory(extra_flags=["--client_ttl=1"])
    q = CTX.Queue()
    p = CTX.Process(target=attached_then_sleep, args=(m.address, q))
    p.start()
    try:
        assert q.get(timeout=60) == "attached"
        assert client_count(m) == 1
        os.kill(p.pid, 19)  # SIGSTOP: alive but silent (no heartbeats)
        wait_until(lambda: client_count(m) == 0, "the silent client to be reclaimed", master=m)
        assert "heartbeat expired" in m.log_tail(20000)
    finally:
        p.kill()
        p.join(30)


def _write_garbage_into_request_rings(pool_path, seed):
    lay = _core._layout()
    with open(pool_path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        try:
            def u(off, fmt):
                return struct.unpack_from(fmt, mm, off)[0]
            ring_region = u(lay["superblock.ring_region_offset"], "<Q")
            ring_bytes = u(lay["superblock.ring_bytes"], "<I")
            slots = u(lay["superblock.client_slot_count"], "<I")
            rnd = __import__("random").Random(seed)
            for slot in range(slots):
                req = ring_region + 2 * slot * ring_bytes
                # Random header counters and random record bytes.
                mm[req:req + 16] = rnd.randbytes(16)
                mm[req + lay["ring_header_size"]:req + ring_bytes] = rnd.randbytes(ring_bytes - lay["ring_header_size"])
        finally:
            mm.close()


def test_garbage_in_the_rings_gets_error_replies_not_a_crash(master, transport):
    s = connect(master)
    try:
        assert s.put("before", b"v") == 0
        for seed in range(3):
            seen = master.log_tail(1 << 20).count("request ring of client slot")
            _write_garbage_into_request_rings(master.pool_path, seed)
            # The ring server notices on its next wake-up (<= 0.5 s); wait for
            # its log line so that our next request is not written into the
            # garbage it is about to skip.
            wait_until(lambda: master.log_tail(1 << 20).count("request ring of client slot") > seen,
                       "the ring server to log the garbage", master=master)
            assert master.proc.poll() is None, "the master died"
            # The client resynchronises: its next calls work.
            for i in range(20):
                assert s.put(f"after{seed}/{i}", b"x" * 100) == 0
            assert s.get("before") == b"v"
            assert s.health_check() == 0
        assert master.log_tail(1 << 20).count("request ring of client slot") >= 3
    finally:
        s.close()
