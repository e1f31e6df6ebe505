"""Master high availability through a real etcd (--enable_ha): two or three
masters on one pool, clients with an etcd:// address. A standby takes over
after the leader is SIGKILLed (under load from several client processes),
a paused leader never writes again once resumed, etcd's loss makes the
leader step down and its return restores service, a standby's or a client's
death changes nothing for the others."""
import os
import re
import signal
import time

from conftest import WAIT_TIMEOUT, metric, open_store, value_for, wait_until
from ha_workers import VALUE_BYTES, attach_and_wait, put_get_load

DEPOSED_EXIT = 4  # kDeposedExitCode (master_ha.h)
# A put during a takeover either succeeds after it or fails with one of these.
TAKEOVER_CODES = {-900, -901, -601, -1010}  # RPC_FAIL, RPC_TIMEOUT, ILLEGAL_CLIENT, UNAVAILABLE


def leader_standby_and_client(ha_master_factory, etcd, **flags):
    """A leader that is serving, a standby campaigning behind it, and a client."""
    a = ha_master_factory(**flags)
    assert a.wait_ready(), a.log_tail()
    b = ha_master_factory(**flags)
    return a, b, open_store(etcd.client_address)


def test_leader_sigkill_under_load(ha_master_factory, etcd, children, tmp_path):
    a = ha_master_factory()
    assert a.wait_ready(), a.log_tail()
    b, c = ha_master_factory(), ha_master_factory()
    stop = str(tmp_path / "stop")
    workers = [children(put_get_load, etcd.client_address, f"w{i}", stop) for i in range(3)]
    for w in workers:
        assert w.recv() == "ready"
    probe = open_store(etcd.client_address)
    # Load runs: wait until some puts went through this leader.
    wait_until(lambda: probe.is_exist("w0-20") == 1 and probe.is_exist("w2-20") == 1, "puts on the first leader")
    killed_at = time.time()
    a.kill()
    new = wait_until(lambda: next((m for m in (b, c) if m.wait_ready(0.1)), None), "a standby to take over")
    # Puts continue through the new leader.
    wait_until(lambda: probe.put("after-takeover", b"y" * 100) == 0, "a put through the new leader", master=new)
    open(stop, "w").close()
    results = [w.result() for w in workers]
    acked = [k for r in results for k, _ in r["acked"]]
    # Every acknowledged put is readable, whole, after the takeover.
    missing = [k for k in acked if probe.get(k) != value_for(k, VALUE_BYTES)]
    assert not missing, f"{len(missing)} acknowledged puts lost, e.g. {missing[:5]}"
    # A failed put is not half-applied: absent, or complete with its value.
    for r in results:
        for key, rc in r["failed"]:
            assert rc in TAKEOVER_CODES, f"{key}: unexpected code {rc}"
            got = probe.get(key)
            assert got in (b"", value_for(key, VALUE_BYTES)), f"{key}: {len(got)} bytes of a failed put"
        assert not r["bad_reads"], f"reads of acknowledged keys failed: {r['bad_reads'][:5]}"
    # The unavailability window: the longest gap between acknowledgements around the kill.
    times = sorted(t for r in results for _, t in r["acked"])
    before = max((t for t in times if t <= killed_at), default=killed_at)
    after = min((t for t in times if t > killed_at), default=None)
    assert after is not None, "no put was acknowledged after the kill"
    failed = sum(len(r["failed"]) for r in results)
    print(f"\nleader SIGKILL: puts unavailable for {(after - before) * 1000:.0f} ms "
          f"(kill to first ack {(after - killed_at) * 1000:.0f} ms), {failed} puts failed with a code, "
          f"{len(acked)} acknowledged, all readable")
    assert metric(new, "mooncake_cxl_corrupt_entries_total") == 0
    probe.close()


def test_paused_leader_is_fenced(ha_master_factory, etcd):
    a, b, s = leader_standby_and_client(ha_master_factory, etcd)
    assert s.put("before-pause", b"p" * 200) == 0
    os.kill(a.proc.pid, signal.SIGSTOP)  # past its lease: the standby takes over
    assert b.wait_ready(WAIT_TIMEOUT), b.log_tail()
    wait_until(lambda: s.put("during-pause", b"q" * 200) == 0, "a put through the new leader", master=b)
    os.kill(a.proc.pid, signal.SIGCONT)
    # Resumed, the old leader finds a newer term or its lapsed lease and exits
    # before any structural write.
    assert a.proc.wait(WAIT_TIMEOUT) == DEPOSED_EXIT, a.log_tail()
    assert "stepping down" in a.log_tail()
    assert s.put("after-resume", b"r" * 200) == 0
    for k, v in (("before-pause", b"p" * 200), ("during-pause", b"q" * 200), ("after-resume", b"r" * 200)):
        assert s.get(k) == v
    assert metric(b, "mooncake_cxl_corrupt_entries_total") == 0
    s.close()


def test_etcd_lost_then_back(ha_master_factory, etcd):
    ttl = 4
    a, b, s = leader_standby_and_client(ha_master_factory, etcd, ttl_s=ttl)
    assert s.put("k0", b"0" * 100) == 0
    etcd.kill()
    # Without etcd the leader keeps its lease until the TTL ends, then steps down.
    assert a.proc.wait(WAIT_TIMEOUT) == DEPOSED_EXIT, a.log_tail()
    assert "lease lapsed" in a.log_tail()
    assert b.proc.poll() is None, "the standby must keep campaigning"
    assert s.get("k0") == b"0" * 100  # one-sided reads go on with no master
    etcd.start()
    assert b.wait_ready(WAIT_TIMEOUT), b.log_tail()
    wait_until(lambda: s.put("k1", b"1" * 100) == 0, "service after etcd returned", master=b)
    assert s.get("k0") == b"0" * 100
    s.close()


def test_standby_killed_changes_nothing(ha_master_factory, etcd):
    a, b, s = leader_standby_and_client(ha_master_factory, etcd)
    assert s.put("s0", b"a" * 100) == 0
    b.kill()
    for i in range(1, 50):
        assert s.put(f"s{i}", b"a" * 100) == 0
    assert a.proc.poll() is None and "stepping down" not in a.log_tail()
    s.close()


def test_client_killed_during_takeover(ha_master_factory, etcd, children):
    a = ha_master_factory()
    assert a.wait_ready(), a.log_tail()
    b = ha_master_factory()
    victim = children(attach_and_wait, etcd.client_address)
    assert victim.recv() == "attached"
    a.kill()
    victim.kill()
    assert b.wait_ready(WAIT_TIMEOUT), b.log_tail()
    s = open_store(etcd.client_address)
    assert s.get("held-by-victim") == b"x" * 64
    # The dead client's slot is reclaimed as after any master restart.
    wait_until(lambda: metric(b, "master_client_count") == 1, "the victim's slot reclaimed", master=b)
    s.close()


def test_views_and_buffers_carry_over(ha_master_factory, etcd):
    """A client's pinned view and registered buffer survive a takeover: the
    view's bytes stay, and the same store writes through the new leader from
    its registered buffer."""
    import numpy as np
    a, b, s = leader_standby_and_client(ha_master_factory, etcd)
    assert s.put("viewed", b"v" * 4096) == 0
    h = s.get_buffer("viewed")
    buf = np.frombuffer(b"r" * 8192, dtype=np.uint8).copy()
    assert s.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    a.kill()
    assert b.wait_ready(WAIT_TIMEOUT), b.log_tail()
    wait_until(lambda: s.put_from("from-buffer", buf.ctypes.data, buf.nbytes) == 0,
               "a put_from through the new leader", master=b)
    assert s.get("from-buffer") == b"r" * 8192
    # The pin came through the takeover: even a forced remove leaves the
    # viewed extent alone while the view lives.
    s.remove("viewed", force=True)
    assert bytes(h) == b"v" * 4096
    del h
    s.close()


def test_pool_changed_after_the_standby_scan(ha_master_factory, etcd):
    """The standby scans the pool ahead of a takeover; the old leader then puts,
    removes, upserts and evicts. The new leader keeps exactly what a recovery
    from the pool alone keeps: every acknowledged put with its newest value,
    nothing removed or evicted comes back."""
    a = ha_master_factory(pool_size=64 << 20)
    assert a.wait_ready(), a.log_tail()
    s = open_store(etcd.client_address)
    big = {}
    for i in range(40):  # the oldest: the first the leader evicts
        big[f"big{i}"] = value_for(f"big{i}", 1 << 20)
        assert s.put(f"big{i}", big[f"big{i}"]) == 0
    small = {f"k{i}": value_for(f"k{i}", 300) for i in range(400)}
    for k, v in small.items():
        assert s.put(k, v) == 0
    # Scans once, before start() returns; no rescan.
    b = ha_master_factory(pool_size=64 << 20, extra_flags=["--ha_standby_rescan_ms=0"])
    removed = [f"k{i}" for i in range(0, 400, 3)]
    for k in removed:
        assert s.remove(k) == 0
        del small[k]
    for i in range(1, 400, 3):  # upserts: a new entry, the old one unlinked
        small[f"k{i}"] = value_for(f"k{i}-new", 500)
        assert s.upsert(f"k{i}", small[f"k{i}"]) == 0
    for i in range(400, 500):  # new keys, some in the removed keys' slots and extents
        small[f"k{i}"] = value_for(f"k{i}", 300)
        assert s.put(f"k{i}", small[f"k{i}"]) == 0
    for i in range(40, 70):  # 70 MiB through a 64 MiB pool: the leader evicts
        k = f"big{i}"
        v = value_for(k, 1 << 20)
        if s.put(k, v) == 0:
            big[k] = v
    assert metric(a, "master_evicted_key_count") > 0
    # What the pool holds now, as the clients see it through the old leader.
    live = {k: v for k, v in {**small, **big}.items() if s.get(k) == v}
    assert all(s.get(k) == b"" for k in removed)
    os.kill(a.proc.pid, signal.SIGSTOP)  # the lease path: the standby takes over once it lapses
    assert b.wait_ready(WAIT_TIMEOUT), b.log_tail()
    wait_until(lambda: s.put("after", b"z" * 100) == 0, "a put through the new leader", master=b)
    m = re.search(r"kept (\d+) objects \((\d+) headers known from the standby's scan\)", b.log_tail(1 << 20))
    assert m, b.log_tail()
    assert 0 < int(m.group(2)) < int(m.group(1))  # the scan served, and missed what changed
    for k, v in live.items():
        assert s.get(k) == v, k
    for k in removed + [k for k in {**small, **big} if k not in live]:
        assert s.get(k) == b"", f"{k} came back"
    # Nothing the clients cannot see either: the new leader's count is exactly theirs.
    assert metric(b, "master_key_count") == len(live) + 1
    assert metric(b, "mooncake_cxl_corrupt_entries_total") == 0
    os.kill(a.proc.pid, signal.SIGCONT)
    assert a.proc.wait(WAIT_TIMEOUT) == DEPOSED_EXIT, a.log_tail()
    s.close()
