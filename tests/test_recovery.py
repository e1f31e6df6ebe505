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

from conftest import connect
from mooncake_cxl import MooncakeDistributedStore, ReplicateConfig

MiB = 1 << 20
RPC_FAIL = -900
NO_AVAILABLE_HANDLE = -200
OBJECT_NOT_FOUND = -704

SIZES = [1, 64, 65, 4095, 4096, 4097, 65536, 300_000, MiB, 123_457]


def value_for(key, size):
    return random.Random(key).randbytes(size)


def objects(prefix, n):
    return {f"{prefix}{i}": value_for(f"{prefix}{i}", SIZES[i % len(SIZES)]) for i in range(n)}


def fill(store, prefix, size=MiB, limit=100_000):
    """Puts hard-pinned values (eviction must not make room) until the first
    failure, which must be -200. Returns the keys stored; their values are
    value_for(key, size)."""
    cfg = ReplicateConfig()
    cfg.with_hard_pin = True
    keys = []
    for n in range(limit):
        key = f"{prefix}{n}"
        rc = store.put(key, value_for(key, size), cfg)
        if rc != 0:
            assert rc == NO_AVAILABLE_HANDLE, f"fill: put #{n} of {size} bytes returned {rc}, expected -200"
            return keys
        keys.append(key)
    raise AssertionError(f"fill: {limit} puts of {size} bytes never ran out of space")


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


def poll_put(store, key, value, bound=10.0):
    """A put retried until it returns 0 or `bound` seconds pass; the last rc."""
    deadline = time.monotonic() + bound
    while True:
        rc = call_with_guard(lambda: store.put(key, value))
        if rc == 0 or time.monotonic() > deadline:
            return rc
        time.sleep(0.2)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_master_restart_keeps_objects_and_space(master_factory, how):
    m1 = master_factory()
    old = connect(m1)
    new = None
    try:
        # Capacity of the fresh pool, in 1 MiB objects.
        baseline = len(fill(old, "fill0/"))
        assert old.remove_all(force=True) == baseline

        objs = objects("rec/", 30)
        for k, v in objs.items():
            assert old.put(k, v) == 0
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
                         f"restart within 10 s: rc {rc}; master log:\n{m2.log_tail()}")
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

        # Space accounting survived: filling the rest never lands on a kept object.
        filled = fill(new, "fill1/")
        assert filled, "nothing could be put after the restart"
        assert_objects(new, kept, "after filling the restarted pool")
        assert_objects(old, kept, "old client after filling the restarted pool")
        for k in filled:
            assert new.get(k) == value_for(k, MiB), f"fill object {k} corrupted"
        # And no space was lost: with everything removed, the pool holds as
        # many 1 MiB objects as when it was fresh.
        assert new.remove_all(force=True) == len(kept) + len(filled)
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


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_master_gone_after_setup(master, how):
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


def test_master_killed_while_a_client_process_puts(master_factory):
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

        deadline = time.monotonic() + 15
        while True:
            s.remove_all(force=True)
            n = len(fill(s, "fill1/"))
            s.remove_all(force=True)
            if abs(n - baseline) <= 1 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert abs(n - baseline) <= 1, (
            f"space leaked across the master crash: an emptied pool holds {n} objects of 1 MiB, "
            f"the fresh pool held {baseline}; master log:\n{m2.log_tail()}")
    finally:
        if s is not None:
            s.close()
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
        child.join(30)
        parent_conn.close()
