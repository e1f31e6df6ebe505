"""While a BufferHandle is alive its bytes never change.

A holder process takes a zero-copy view; then its pin is put to the test: a
master SIGKILL + restart, the holder's own close(), or the holder SIGSTOPped
past --client_ttl (reclaimed while alive) and resumed. Meanwhile another
process, once the view's lease has lapsed, removes the viewed key (unforced:
a viewed object is unlinked, its extent kept for the view) and refills the
whole pool with other values. The
holder's handle must show the original bytes or refuse access (BufferError),
never another object's bytes. When the holder finally drops its view, the
extent comes back (no leak).

The lease is 50 ms, so that only the pin protects the object.

The one case where the master does drop a live view's pin (a retired client of
another host past --put_start_release_timeout_sec) is simulated by clearing the
pin records in the pool: the handle then refuses access (BufferError).
"""
import multiprocessing as mp
import os
import signal

import pytest

from conftest import connect, fill, value_for, wait_for_leases_to_lapse, wait_for_log, wait_for_space_back
from view_workers import digest, holder

pytestmark = pytest.mark.usefixtures("no_put_wait")

CTX = mp.get_context("spawn")
POOL = 32 << 20
VALUE = 1 << 20
LEASE = "--default_kv_lease_ttl=50"
TIMEOUT = 60  # hang guard only


def _expect(q, what):
    msg = q.get(timeout=TIMEOUT)
    assert msg[0] != "error", f"holder: {msg[1]}"
    return msg


def _check_view(msg, want, when):
    kind, seen = msg
    assert kind in ("bytes", "refused"), msg
    if kind == "bytes":
        assert seen == want, f"{when}: the live BufferHandle shows other bytes"
    return kind


def _remove(s, m, key):
    """Once the lease is over, an unforced remove of the viewed key unlinks it."""
    wait_for_leases_to_lapse(m)
    assert s.remove(key) == 0
    assert s.remove(key, force=True) == -704
    assert s.is_exist(key) == 0


def _remove_and_refill(s, m, key, prefix):
    _remove(s, m, key)
    return fill(s, prefix, size=VALUE)


def _space_back(s, baseline, m, what):
    """After the view is dropped the pool again holds `baseline` objects
    (the holder's retired table and the pinned extent are released)."""
    wait_for_space_back(s, baseline, m, f"{what}, once the view was dropped", tolerance=0)


def _baseline(s):
    n = len(fill(s, "base/", size=VALUE))
    s.remove_all(force=True)
    return n


def _start_holder(m, key, steps, close_first=False):
    q = CTX.Queue()
    p = CTX.Process(target=holder, args=(m.address, key, q, steps, close_first), daemon=True)
    p.start()
    return p, q


def _finish(p, q):
    msg = _expect(q, "after")
    assert msg[0] == "after" and msg[1] == 0 and msg[2], f"the holder's store is unusable afterwards: {msg}"
    p.join(TIMEOUT)
    assert p.exitcode == 0


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_view_survives_master_restart(master_factory, transport, how):
    m1 = master_factory(pool_size=POOL, extra_flags=[LEASE])
    s = connect(m1)
    baseline = _baseline(s)
    value = value_for("viewed", VALUE)
    assert s.put("viewed", value) == 0
    want = digest(value)
    restarted, refilled = CTX.Event(), CTX.Event()
    p, q = _start_holder(m1, "viewed", [restarted, refilled])
    try:
        _check_view(_expect(q, "view"), want, "before the restart")
        s.close()
        if how == "sigkill":
            m1.kill()
        else:
            m1.stop()
        m2 = master_factory(pool_size=POOL, format=False, extra_flags=[LEASE, f"--rpc_port={m1.port}"])
        restarted.set()
        _check_view(_expect(q, "restart"), want, "after the restart")
        s = connect(m2)
        filled = _remove_and_refill(s, m2, "viewed", "other/")
        assert filled, "nothing could be put after the restart"
        refilled.set()
        _check_view(_expect(q, "refill"), want, f"[{transport}] after a master {how}, remove and refill")
        _finish(p, q)
        _space_back(s, baseline, m2, "master restart")
    finally:
        restarted.set()
        refilled.set()
        p.join(5)
        if p.is_alive():
            p.kill()
        s.close()


def test_view_survives_close(master_factory, transport):
    m = master_factory(pool_size=POOL, extra_flags=[LEASE])
    s = connect(m)
    baseline = _baseline(s)
    value = value_for("closed-view", VALUE)
    assert s.put("closed-view", value) == 0
    want = digest(value)
    refilled = CTX.Event()
    p, q = _start_holder(m, "closed-view", [refilled], close_first=True)
    try:
        _check_view(_expect(q, "view"), want, "before close")
        _check_view(_expect(q, "close"), want, "right after close()")
        _remove_and_refill(s, m, "closed-view", "other/")
        refilled.set()
        _check_view(_expect(q, "refill"), want, f"[{transport}] after close(), remove and refill")
        _finish(p, q)
        _space_back(s, baseline, m, "close()")
    finally:
        refilled.set()
        p.join(5)
        if p.is_alive():
            p.kill()
        s.close()


def test_view_of_a_client_reclaimed_while_stopped(master_factory, transport):
    m = master_factory(pool_size=POOL, extra_flags=[LEASE, "--client_ttl=1"])
    s = connect(m)
    baseline = _baseline(s)
    value = value_for("stopped-view", VALUE)
    assert s.put("stopped-view", value) == 0
    want = digest(value)
    resumed = CTX.Event()
    p, q = _start_holder(m, "stopped-view", [resumed])
    try:
        _check_view(_expect(q, "view"), want, "before the stop")
        os.kill(p.pid, signal.SIGSTOP)
        try:
            wait_for_log(m, "reclaimed: heartbeat expired")
            _remove_and_refill(s, m, "stopped-view", "other/")
        finally:
            os.kill(p.pid, signal.SIGCONT)
        resumed.set()
        _check_view(_expect(q, "resume"), want, f"[{transport}] after a reclaim while stopped, remove and refill")
        _finish(p, q)
        _space_back(s, baseline, m, "reclaim while stopped")
    finally:
        resumed.set()
        if p.is_alive():
            os.kill(p.pid, signal.SIGCONT)
        p.join(5)
        if p.is_alive():
            p.kill()
        s.close()


def test_killed_holder_releases_its_view(master_factory):
    """The pin of a SIGKILLed holder dies with it, also when its slot was
    retired first (closed with a live view): the space comes back."""
    m = master_factory(pool_size=POOL, extra_flags=[LEASE])
    s = connect(m)
    baseline = _baseline(s)
    assert s.put("dead-view", value_for("dead-view", VALUE)) == 0
    never = CTX.Event()
    p, q = _start_holder(m, "dead-view", [never], close_first=True)
    try:
        _expect(q, "view")
        _expect(q, "close")
        _remove(s, m, "dead-view")
        p.kill()
        p.join(TIMEOUT)
        _space_back(s, baseline, m, "killed holder")
    finally:
        if p.is_alive():
            p.kill()
        s.close()


def _zero_all_pin_records(pool_path):
    """What the master does to a retired table of another host's client past
    --put_start_release_timeout_sec: the records are dropped."""
    import mmap
    import struct
    with open(pool_path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        try:
            slots, = struct.unpack_from("<I", mm, 56)
            table, per = struct.unpack_from("<QI", mm, 64)
            mm[table:table + slots * per * 16] = bytes(slots * per * 16)
        finally:
            mm.close()


def test_handle_refuses_access_once_its_pin_is_dropped(master, pool_path):
    s = connect(master)
    try:
        assert s.put("dropped", b"v" * 4096) == 0
        h = s.get_buffer("dropped")
        assert bytes(h) == b"v" * 4096
        _zero_all_pin_records(pool_path)
        with pytest.raises(BufferError) as e:
            memoryview(h)
        why = e.value.__cause__ or e.value.__context__ or e.value
        assert "dropped this view's pin" in str(why)
        with pytest.raises(BufferError):
            bytes(h)
        with pytest.raises(BufferError):
            h.ptr()
        del h  # dropping a handle whose record is gone is harmless
        h2 = s.get_buffer("dropped")
        assert h2 is not None and bytes(h2) == b"v" * 4096
    finally:
        s.close()
