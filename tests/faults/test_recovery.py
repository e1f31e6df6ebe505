"""Master crashes and restarts on the same pool, and clients whose master is gone.

A master started without --format on a formatted pool recovers it: every
COMPLETE object stays readable, removed objects stay removed, space accounting
is rebuilt from the index. Clients keep reading one-sidedly while no master
runs, and a client set up before the crash re-attaches by itself once a master
answers again at the same address.

No timing assertions: waits are polls with generous bounds that only guard
against hangs.
"""
import multiprocessing as mp
import os
import random
import signal
import socket
import threading
import time
import traceback

import pytest

from conftest import connect, fill, poll, value_for, wait_for_space_back, wait_until
from mooncake_cxl import MooncakeDistributedStore, ReplicateConfig


pytestmark = pytest.mark.usefixtures("no_put_wait")


@pytest.fixture(params=["ring", "tcp"])
def rpc(request, monkeypatch):
    """The client's control path to the master (MC_CXL_RPC, read at setup;
    spawned children inherit it): shared-memory rings in the pool (the
    default) or TCP. Restarts and outages must be handled on both."""
    monkeypatch.setenv("MC_CXL_RPC", request.param)
    return request.param


MiB = 1 << 20
RPC_FAIL = -900
RPC_TIMEOUT = -901
NO_AVAILABLE_HANDLE = -200
OBJECT_NOT_FOUND = -704

SIZES = [1, 64, 65, 4095, 4096, 4097, 65536, 300_000, MiB, 123_457]




def objects(prefix, n):
    return {f"{prefix}{i}": value_for(f"{prefix}{i}", SIZES[i % len(SIZES)]) for i in range(n)}


def assert_objects(store, objs, who):
    for k, v in objs.items():
        got = store.get(k)
        assert got == v, f"{who}: get({k}) returned {len(got)} bytes, expected {len(v)} (or content differs)"
        assert store.is_exist(k) == 1, f"{who}: is_exist({k})"
        assert store.get_size(k) == len(v), f"{who}: get_size({k})"
    keys = list(objs)
    assert store.get_batch(keys) == [objs[k] for k in keys], f"{who}: get_batch differs"


def assert_absent(store, keys, who):
    for k in keys:
        assert store.get(k) == b"", f"{who}: removed key {k} is readable"
        assert store.is_exist(k) == 0, f"{who}: removed key {k}: is_exist = {store.is_exist(k)}"
        assert store.get_size(k) == OBJECT_NOT_FOUND, f"{who}: get_size({k}) = {store.get_size(k)}"


def call_with_guard(fn, timeout=60):
    """Runs fn() in a thread; fails the test if it does not return within
    `timeout` (a hang guard, not a timing requirement)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # reported below
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"call did not return within {timeout} s (hang)"
    if "error" in out:
        raise out["error"]
    return out["value"]


def poll_put(store, key, value):
    """A put retried until it returns 0 (or the hang guard passes); the last rc."""
    return poll(lambda: call_with_guard(lambda: store.put(key, value)), interval=0.2, done=lambda rc: rc == 0)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_master_restart_keeps_objects_and_space(master_factory, how, rpc):
    m1 = master_factory()
    old = connect(m1)
    new = None
    try:
        # Capacity of the fresh pool, in 1 MiB objects.
        baseline = len(fill(old, "fill0/"))
        assert old.remove_all(force=True) == baseline

        # Odd-numbered objects are hard-pinned: eviction may not touch them
        # when the pool is filled below; the others may be evicted then.
        objs = objects("rec/", 30)
        pin = ReplicateConfig()
        pin.with_hard_pin = True
        for i, (k, v) in enumerate(objs.items()):
            assert old.put(k, v, pin if i % 2 else ReplicateConfig()) == 0
        pinned = {k for i, k in enumerate(objs) if i % 2}
        removed = [k for i, k in enumerate(objs) if i % 5 == 0]
        for k in removed:
            assert old.remove(k, force=True) == 0
        kept = {k: v for k, v in objs.items() if k not in removed}
        upserted = {"rec/up": value_for("rec/up#2", 5000)}
        assert old.put("rec/up", value_for("rec/up#1", 7000)) == 0
        assert old.upsert("rec/up", upserted["rec/up"]) == 0
        kept.update(upserted)
        assert_objects(old, kept, "before the restart")

        if how == "sigkill":
            m1.kill()
        else:
            m1.stop()
        # No master: reads are one-sided and keep working.
        assert_objects(old, kept, "old client, master down")
        assert_absent(old, removed, "old client, master down")

        # Same pool, no format, same address (so that the old client finds it).
        m2 = master_factory(format=False, extra_flags=[f"--rpc_port={m1.port}"])
        assert m2.port == m1.port
        assert m2.uuid == m1.uuid, "restart without --format must keep the pool (same UUID)"

        new = connect(m2)
        assert_objects(new, kept, "new client after the restart")
        assert_absent(new, removed, "new client after the restart")
        assert_objects(old, kept, "old client after the restart")

        # The old client re-attaches by itself: its next put succeeds.
        v = value_for("after/old", 250_000)
        rc = poll_put(old, "after/old", v)
        assert rc == 0, (f"the client set up before the master {how} could not put after the "
                         f"restart: rc {rc}; master log:\n{m2.log_tail()}")
        assert new.get("after/old") == v
        v2 = value_for("after/new", 4097)
        assert new.put("after/new", v2) == 0
        assert old.get("after/new") == v2
        kept["after/old"] = v
        kept["after/new"] = v2
        # A removed key can be put again.
        assert new.put(removed[0], b"again") == 0
        assert old.get(removed[0]) == b"again"
        kept[removed[0]] = b"again"

        # Space accounting survived: filling the rest never lands on a kept
        # object. (Unpinned objects may be evicted by the fill: then absent.)
        filled = fill(new, "fill1/")
        assert filled, "nothing could be put after the restart"
        assert_objects(new, {k: v for k, v in kept.items() if k in pinned},
                       "pinned objects after filling the restarted pool")
        evicted = []
        for who, store in (("new client", new), ("old client", old)):
            for k, v in kept.items():
                got = store.get(k)
                if got == b"" and k not in pinned:
                    evicted.append(k)
                    continue
                assert got == v, (f"{who}: {k} after filling the restarted pool: {len(got)} bytes, "
                                  f"expected {len(v)}: overwritten by a fill object?")
        for k in filled:
            assert new.get(k) == value_for(k, MiB), f"fill object {k} corrupted"
        print(f"unpinned objects evicted by the fill: {sorted(set(evicted))}")
        # And no space was lost: with everything removed, the pool holds as
        # many 1 MiB objects as when it was fresh.
        present = sum(1 for k in kept if new.is_exist(k) == 1)
        assert new.remove_all(force=True) == present + len(filled)
        refill = fill(new, "fill2/")
        assert abs(len(refill) - baseline) <= 1, (
            f"after the {how} restart an emptied pool holds {len(refill)} objects of 1 MiB, "
            f"the fresh pool held {baseline}")
    finally:
        old.close()
        if new is not None:
            new.close()


def test_restart_twice_in_a_row(master_factory):
    """Recovery of a recovered pool (two crashes without a put in between)."""
    m1 = master_factory()
    s = connect(m1)
    objs = objects("twice/", 12)
    try:
        for k, v in objs.items():
            assert s.put(k, v) == 0
    finally:
        s.close()
    m1.kill()
    m2 = master_factory(format=False)
    m2.kill()
    m3 = master_factory(format=False)
    s = connect(m3)
    try:
        assert_objects(s, objs, "after two restarts")
        assert s.put("twice/more", b"x" * 1000) == 0
        assert s.get("twice/more") == b"x" * 1000
    finally:
        s.close()


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_first_put_after_a_restart_succeeds(master_factory, how, rpc):
    """client.h: "A lost master connection is re-established on the next call;
    if the master restarted, the client re-attaches and a put is retried once."
    So the very first put after a restart succeeds, with no polling."""
    m1 = master_factory()
    s = connect(m1)
    try:
        assert s.put("first/before", b"b" * 100) == 0
        if how == "sigkill":
            m1.kill()
        else:
            m1.stop()
        master_factory(format=False, extra_flags=[f"--rpc_port={m1.port}"])
        rc = call_with_guard(lambda: s.put("first/after", b"a" * 100))
        second = call_with_guard(lambda: s.put("first/second", b"c" * 100))
        assert rc == 0, (
            f"[{rpc}] the first put after a master {how} + restart returned {rc} (the next one "
            f"returned {second}); client.h promises a re-attach and one retry. With the ring "
            f"transport the ring call fails (new incarnation), MasterCall's Attach(false) then goes "
            f"out on the TCP socket of the previous master's connection, fails with RPC_FAIL, and "
            f"MasterCall gives up instead of reconnecting. (Can pass by chance when the heartbeat "
            f"thread re-attached first.)")
        assert s.get("first/after") == b"a" * 100
    finally:
        call_with_guard(s.close)


def test_setup_without_master_returns_rpc_fail():
    port = free_port()  # nothing listens there
    s = MooncakeDistributedStore()
    try:
        rc = call_with_guard(
            lambda: s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", f"127.0.0.1:{port}"),
            timeout=30)
        assert rc == RPC_FAIL, f"setup with no master returned {rc}, expected -900 (RPC_FAIL)"
        # Not set up: data methods return errors, no crash.
        assert s.health_check() == 1
        assert s.put("k", b"v") < 0
        assert s.get("k") == b""
    finally:
        s.close()


def test_frozen_master(master, monkeypatch, rpc):
    """A master that accepts connections but does not answer (SIGSTOP): setup
    and puts give up with an error instead of hanging, one-sided reads keep
    working, and once the master runs again the existing client's puts succeed."""
    monkeypatch.setenv("MC_CXL_RPC_TIMEOUT_MS", "1000")  # short reply timeout for this test
    s = connect(master)
    late = MooncakeDistributedStore()
    try:
        v = value_for("frozen/k", 70_000)
        assert s.put("frozen/k", v) == 0
        os.kill(master.proc.pid, signal.SIGSTOP)
        try:
            rc = call_with_guard(
                lambda: late.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", master.address))
            assert rc < 0, f"setup against a frozen master returned {rc}"
            assert rc in (RPC_FAIL, RPC_TIMEOUT), f"setup against a frozen master returned {rc}"
            rc = call_with_guard(lambda: s.put("frozen/new", b"y" * 100))
            assert rc < 0, f"put with a frozen master returned {rc}"
            assert s.get("frozen/k") == v
            assert s.is_exist("frozen/k") == 1
            assert call_with_guard(s.health_check) == 2
        finally:
            os.kill(master.proc.pid, signal.SIGCONT)
        rc = poll_put(s, "frozen/after", b"z" * 100)
        assert rc == 0, f"after SIGCONT the client's put still returns {rc}"
        assert s.get("frozen/after") == b"z" * 100
        assert call_with_guard(s.health_check) == 0
        assert s.get("frozen/k") == v
        # The put that timed out while the master was frozen must not block its
        # key: retried now, it returns 0, so its value must be readable.
        rc = poll_put(s, "frozen/new", b"y" * 100)
        assert rc == 0, f"retrying the put that timed out returned {rc}"
        got = s.get("frozen/new")
        assert got == b"y" * 100, (
            f"lost write: a put that timed out against a frozen master, retried after the master "
            f"resumed, returned 0 but get returns {got!r} (is_exist {s.is_exist('frozen/new')}). "
            f"The resumed master processed the abandoned PutStart late and left an orphan WRITING "
            f"entry owned by this live client; the retry saw it as an existing key (0, 'first value "
            f"kept') although no value will ever be written; only --put_start_discard_timeout_sec "
            f"(30 s) revokes it, and its extent stays reserved for --put_start_release_timeout_sec "
            f"(600 s).")
    finally:
        call_with_guard(late.close)
        call_with_guard(s.close)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_master_gone_after_setup(master, how, rpc):
    s = connect(master)
    try:
        v = value_for("gone/k", 100_000)
        assert s.put("gone/k", v) == 0
        assert s.health_check() == 0
        if how == "sigkill":
            master.kill()
        else:
            master.stop()
        rc = call_with_guard(lambda: s.put("gone/new", b"x" * 1000))
        assert rc < 0, f"put with the master gone returned {rc}"
        # Reads are one-sided.
        assert s.get("gone/k") == v
        assert s.get_batch(["gone/k", "gone/new"]) == [v, b""]
        assert s.is_exist("gone/k") == 1
        assert s.is_exist("gone/new") == 0
        assert s.get_size("gone/k") == len(v)
        assert call_with_guard(s.health_check) == 2
        assert call_with_guard(lambda: s.remove("gone/k", force=True)) < 0
        assert s.get("gone/k") == v, "a failed remove must leave the object"
    finally:
        assert call_with_guard(s.close) == 0


# --------------------------------------------------------------------------
# A client process that keeps putting while the master is killed and restarted.

CTX = mp.get_context("spawn")
LOOP_VALUE = 512 << 10
LOOP_MAX_ITERS = 3000      # a bound on the child's loop, never expected to be reached
LOOP_PUTS_AFTER_FAILURE = 10


def _putting_child(conn, address):
    """Puts distinct keys and reports every rc; after it has seen a failure (the
    master is down) it stops once LOOP_PUTS_AFTER_FAILURE further puts succeed."""
    try:
        s = MooncakeDistributedStore()
        rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address)
        if rc != 0:
            conn.send(("setup", rc))
            return
        failed, ok_after = False, 0
        for i in range(LOOP_MAX_ITERS):
            key = f"loop/{i}"
            rc = s.put(key, value_for(key, LOOP_VALUE))
            conn.send(("rc", key, rc))
            if rc != 0:
                failed = True
                time.sleep(0.05)  # the master is down: do not spin
            elif failed:
                ok_after += 1
                if ok_after >= LOOP_PUTS_AFTER_FAILURE:
                    break
        s.close()
        conn.send(("end",))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def test_master_killed_while_a_client_process_puts(master_factory, rpc):
    """SIGKILL the master while another process puts in a loop, restart it on
    the same pool and port: every put that returned 0 is readable and intact,
    every put that failed left nothing, the child's puts resume by themselves,
    and no space leaks (the restarted master releases the unfinished put of a
    live client after --put_start_release_timeout_sec, set to 1 s here)."""
    m1 = master_factory()
    s = connect(m1)
    baseline = len(fill(s, "fill0/"))
    assert s.remove_all(force=True) == baseline
    s.close()

    parent_conn, child_conn = CTX.Pipe()
    child = CTX.Process(target=_putting_child, args=(child_conn, m1.address), daemon=True)
    child.start()
    child_conn.close()
    results = []  # (key, rc) in order

    def next_msg(timeout=60):
        assert parent_conn.poll(timeout), f"putting child silent for {timeout} s (hung?)"
        msg = parent_conn.recv()
        assert msg[0] != "error", f"putting child failed:\n{msg[1]}"
        assert msg[0] != "setup", f"putting child: setup returned {msg[1]}"
        if msg[0] == "rc":
            results.append((msg[1], msg[2]))
        return msg

    s = None
    try:
        while sum(1 for _, rc in results if rc == 0) < 5:
            next_msg()
        m1.kill()
        while not any(rc != 0 for _, rc in results):
            assert next_msg()[0] == "rc", "the child ended before it saw the master down"
        m2 = master_factory(format=False, extra_flags=[f"--rpc_port={m1.port}",
                                                      "--put_start_release_timeout_sec=1"])
        while next_msg(120)[0] != "end":
            pass
        child.join(60)

        s = connect(m2)
        ok = [k for k, rc in results if rc == 0]
        bad = [(k, rc) for k, rc in results if rc != 0]
        for k in ok:
            got = s.get(k)
            assert got == value_for(k, LOOP_VALUE), (
                f"{k}: put returned 0 around a master crash, get returned {len(got)} bytes "
                f"(expected {LOOP_VALUE}, intact)")
        for k, rc in bad:
            assert s.is_exist(k) == 0, f"{k}: put returned {rc} but the key exists"
        first_bad = next(i for i, (_, rc) in enumerate(results) if rc != 0)
        resumed = sum(1 for _, rc in results[first_bad:] if rc == 0)
        assert resumed >= LOOP_PUTS_AFTER_FAILURE, (
            f"the child's puts did not resume after the restart: {results[first_bad:][:20]}")
        print("recovery log:", [l for l in m2.log_tail(100_000).splitlines() if "recovery:" in l])

        wait_for_space_back(s, baseline, m2, "across the master crash")
    finally:
        if s is not None:
            s.close()
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
        child.join(30)
        parent_conn.close()


# --------------------------------------------------------------------------
# A live client stalled in the middle of its copy into the pool.
#
# The value is put from an anonymous mapping whose second half is registered
# with userfaultfd (user-mode faults only): the client's memcpy into the pool
# blocks on the first unpopulated page, with its entry WRITING and its extent
# allocated, until the test lets it go (closing the userfaultfd resolves the
# fault with zero pages). The helper thread reports the blocked fault, so the
# test acts exactly while the put is unfinished: no timing involved.

STALL_VALUE = 4 << 20
SYS_userfaultfd = 323          # x86_64
UFFD_USER_MODE_ONLY = 1
UFFDIO_API = 0xc018aa3f
UFFDIO_REGISTER = 0xc020aa00
UFFDIO_REGISTER_MODE_MISSING = 1


def _stalling_buffer(size):
    """(mmap, userfaultfd) where reading past size // 2 blocks; raises OSError
    when userfaultfd is unavailable."""
    import ctypes
    import fcntl
    import mmap
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if os.uname().machine != "x86_64":
        raise OSError("userfaultfd syscall number known for x86_64 only")
    fd = libc.syscall(SYS_userfaultfd, os.O_CLOEXEC | os.O_NONBLOCK | UFFD_USER_MODE_ONLY)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "userfaultfd")
    fcntl.ioctl(fd, UFFDIO_API, bytearray(struct.pack("QQQ", 0xAA, 0, 0)))
    mm = mmap.mmap(-1, size)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    half = size // 2
    mm[:half] = random.Random("stall").randbytes(half)  # populated: copies fine
    fcntl.ioctl(fd, UFFDIO_REGISTER,
                bytearray(struct.pack("QQQQ", addr + half, half, UFFDIO_REGISTER_MODE_MISSING, 0)))
    return mm, fd


def _stalled_putter(conn, address, op):
    """Puts (or upserts) "stall/doomed" from a stalling buffer. Protocol:
    -> ("blocked",) once the copy is stuck; <- "release" lets it go;
    -> ("stalled-done", rc); <- "go"; a second put; -> ("done", rc)."""
    import select

    try:
        s = MooncakeDistributedStore()
        rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address)
        if rc != 0:
            conn.send(("setup", rc))
            return
        assert s.put("stall/ok", b"complete before the stall") == 0
        try:
            mm, fd = _stalling_buffer(STALL_VALUE)
        except OSError as e:
            conn.send(("no-uffd", str(e)))
            return

        def helper():
            # The put's copy faulted: tell the parent, wait for "release".
            ready, _, _ = select.select([fd], [], [], 120)
            conn.send(("blocked",) if ready else ("never-blocked",))
            if conn.poll(300):
                conn.recv()
            os.close(fd)  # wakes the faulting copy (the rest reads as zeros)

        th = threading.Thread(target=helper, daemon=True)
        th.start()
        do = s.put if op == "put" else s.upsert
        rc = do("stall/doomed", memoryview(mm))
        th.join(60)
        conn.send(("stalled-done", rc))
        if conn.poll(300):
            conn.recv()
        # The master may just have restarted: the client re-attaches by itself.
        attempts = []

        def put_after():
            attempts.append(s.put("stall/after", b"a put after the stalled one"))
            return attempts[-1]

        after = poll(put_after, interval=0.2, done=lambda rc: rc == 0)
        s.close()
        conn.send(("done", after, attempts[:5], len(attempts)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def stalled_value():
    """What the stalled put stores if it completes: the populated half, then
    the zeros the released userfaultfd range reads as."""
    half = STALL_VALUE // 2
    return random.Random("stall").randbytes(half) + bytes(half)


def _start_stalled_putter(address, op="put"):
    parent_conn, child_conn = CTX.Pipe()
    child = CTX.Process(target=_stalled_putter, args=(child_conn, address, op), daemon=True)
    child.start()
    child_conn.close()
    return child, parent_conn


def _stop_child(child, conn):
    if child.is_alive():
        os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    conn.close()


def _expect(conn, kind, timeout=60):
    assert conn.poll(timeout), f"stalled-put child silent for {timeout} s (hung?)"
    msg = conn.recv()
    if msg[0] == "no-uffd":
        pytest.skip(f"userfaultfd unavailable here, cannot stall a put deterministically: {msg[1]}")
    assert msg[0] == kind, f"stalled-put child: expected {kind}, got {msg}"
    return msg


OLD_VALUE = b"the value before the upsert" * 1000


@pytest.mark.parametrize("op", ["put", "upsert"])
@pytest.mark.parametrize("how,transport", [("sigkill", "ring"), ("sigterm", "ring"), ("sigkill", "tcp")])
def test_master_restart_while_a_live_client_is_mid_put(master_factory, monkeypatch, how, transport, op):
    """The master dies while a live client is copying a value (entry WRITING),
    and restarts before the copy ends. Recovery revokes the unfinished put: it
    never becomes visible (an upserted key keeps its old value), the client's
    put reports failure once its copy ends, its next put works, and the extent
    is released after --put_start_release_timeout_sec (1 s here)."""
    monkeypatch.setenv("MC_CXL_RPC", transport)
    m1 = master_factory()
    s = connect(m1)
    baseline = len(fill(s, "fill0/"))
    assert s.remove_all(force=True) == baseline
    if op == "upsert":
        assert s.put("stall/doomed", OLD_VALUE) == 0
    before = OLD_VALUE if op == "upsert" else b""
    child, conn = _start_stalled_putter(m1.address, op)
    try:
        _expect(conn, "blocked")
        assert s.get("stall/doomed") == before, "a reader saw an unfinished put"
        s.close()
        s = None
        if how == "sigkill":
            m1.kill()
        else:
            m1.stop()
        m2 = master_factory(format=False, extra_flags=[f"--rpc_port={m1.port}",
                                                      "--put_start_release_timeout_sec=1"])
        s = connect(m2)
        assert s.get("stall/ok") == b"complete before the stall"
        assert s.get("stall/doomed") == before, "recovery did not revoke an unfinished put"
        conn.send("release")
        _, rc = _expect(conn, "stalled-done")
        assert rc < 0, (f"the {op} whose entry recovery revoked returned {rc}; the key now holds "
                        f"{len(s.get('stall/doomed'))} bytes")
        assert s.get("stall/doomed") == before, "a revoked put became visible after its copy ended"
        conn.send("go")
        _, after, attempts, n = _expect(conn, "done")
        assert after == 0, (f"the client's puts after the restart kept failing for 10 s: "
                            f"{n} attempts, first return codes {attempts}")
        assert s.get("stall/after") == b"a put after the stalled one"
        child.join(30)
        wait_for_space_back(s, baseline, m2, f"the {op} revoked by recovery")
    finally:
        if s is not None:
            s.close()
        _stop_child(child, conn)


@pytest.mark.parametrize("op", ["put", "upsert"])
def test_put_completing_while_the_master_is_down(master_factory, op):
    """A put whose copy ends while no master runs still completes (the client
    publishes the entry itself) and is visible one-sidedly; the restarted
    master keeps it (for an upsert: the new value, the old one is dropped and
    its space freed)."""
    m1 = master_factory()
    s = connect(m1)
    baseline = len(fill(s, "fill0/"))
    assert s.remove_all(force=True) == baseline
    if op == "upsert":
        assert s.put("stall/doomed", OLD_VALUE) == 0
    child, conn = _start_stalled_putter(m1.address, op)
    try:
        _expect(conn, "blocked")
        m1.kill()
        conn.send("release")
        _, rc = _expect(conn, "stalled-done")
        assert rc == 0, f"a {op} whose copy ended while the master was down returned {rc}"
        new = stalled_value()
        got = s.get("stall/doomed")
        assert got == new, (f"master down: the completed {op} reads as {len(got)} bytes "
                            f"({'the old value' if got == OLD_VALUE else 'not the new value'})")
        s.close()
        s = None
        m2 = master_factory(format=False, extra_flags=[f"--rpc_port={m1.port}"])
        s = connect(m2)
        got = s.get("stall/doomed")
        assert got == new, (f"after the restart the {op} completed while the master was down reads "
                            f"as {len(got)} bytes ({'the old value' if got == OLD_VALUE else 'lost'})")
        conn.send("go")
        _, after, attempts, n = _expect(conn, "done")
        assert after == 0, (f"the client's puts after the restart kept failing for 10 s: "
                            f"{n} attempts, first return codes {attempts}")
        child.join(30)
        # One object for the key, and the old value's space was freed.
        assert s.remove_all(force=True) == 3  # stall/ok, stall/doomed, stall/after
        wait_for_space_back(s, baseline, m2, f"the {op} completed while the master was down")
    finally:
        if s is not None:
            s.close()
        _stop_child(child, conn)


@pytest.mark.parametrize("op", ["put", "upsert"])
def test_stalled_put_is_revoked_by_the_discard_timeout(master_factory, op):
    """A live client stuck in its copy longer than --put_start_discard_timeout_sec:
    the master revokes the put (never visible; an upserted key keeps its old
    value), the client's put fails once it resumes, and the extent is freed
    after --put_start_release_timeout_sec."""
    m = master_factory(extra_flags=["--put_start_discard_timeout_sec=1",
                                    "--put_start_release_timeout_sec=2"])
    s = connect(m)
    child, conn = None, None
    try:
        baseline = len(fill(s, "fill0/"))
        assert s.remove_all(force=True) == baseline
        if op == "upsert":
            assert s.put("stall/doomed", OLD_VALUE) == 0
        before = OLD_VALUE if op == "upsert" else b""
        child, conn = _start_stalled_putter(m.address, op)
        _expect(conn, "blocked")

        def revoked():
            assert s.get("stall/doomed") == before, "a reader saw an unfinished put"
            return any("revoked" in line and "stall/doomed" in line
                       for line in m.log_tail(1_000_000).splitlines())

        wait_until(revoked, "a 'revoked ... stall/doomed' line in the master log (discard timeout 1 s)",
                   master=m, interval=0.2)
        assert s.get("stall/doomed") == before
        conn.send("release")
        _, rc = _expect(conn, "stalled-done")
        assert rc < 0, f"a {op} revoked by the discard timeout returned {rc}"
        assert s.get("stall/doomed") == before, "a revoked put became visible"
        conn.send("go")
        _, after, attempts, n = _expect(conn, "done")
        assert after == 0, f"put after the revoked one: {n} attempts, first return codes {attempts}"
        child.join(30)
        wait_for_space_back(s, baseline, m, f"the {op} revoked by the discard timeout")
    finally:
        s.close()
        if child is not None:
            _stop_child(child, conn)
