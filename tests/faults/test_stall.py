"""Clients stopped (SIGSTOP) long enough for the master to give up on them,
then resumed: they may damage nothing but their own revoked put, and they
must not use the rings of the client that took their slot.

Several real processes each: the master, the stopped client, the clients
that run while it is stopped, and a checker. No timing assertions: waits are
polls with generous bounds that only guard against hangs.
"""
import multiprocessing as mp
import os
import random
import re
import signal
import time
import urllib.request

import pytest

import stall_workers as W
from conftest import connect, fill, log_size, wait_for_log, wait_for_space_back

CTX = mp.get_context("spawn")
pytestmark = pytest.mark.usefixtures("no_put_wait")

MiB = 1 << 20
TRANSFER_FAIL = -800


def _start(target, *args):
    parent, child = CTX.Pipe()
    p = CTX.Process(target=target, args=(child,) + args, daemon=True)
    p.start()
    child.close()
    return p, parent


def _expect(conn, kind, timeout=60):
    assert conn.poll(timeout), f"child silent for {timeout} s (hung?) while expecting {kind}"
    msg = conn.recv()
    if msg[0] == "no-uffd":
        pytest.skip(f"userfaultfd unavailable here, cannot stall a copy deterministically: {msg[1]}")
    assert msg[0] != "error", f"child failed:\n{msg[1]}"
    assert msg[0] == kind, f"child: expected {kind}, got {msg}"
    return msg


def _kill(*procs):
    for p in procs:
        if p is not None and p.is_alive():
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        if p is not None:
            p.join(30)


def _slot_of(master, pid):
    slots = re.findall(rf"\(pid {pid}(?:, [^)]*)?\) attached as slot (\d+)", master.log_tail(1 << 30))
    assert slots, f"pid {pid} never attached; master log:\n{master.log_tail()}"
    return int(slots[-1])


# ---------------------------------------------------------------------------
# Item: a stalled writer resumed after its put was revoked and its extent
# could have been reused.
#
# The writer's copy blocks (userfaultfd) in the middle of a chunk, the
# process is SIGSTOPped past --client_ttl + --put_start_release_timeout_sec,
# the master reclaims it and revokes the put, another process fills the pool
# with hard-pinned checksummed objects, then the writer resumes and its copy
# goes on (the rest of the value reads as zeros). Every hard-pinned object
# must read back intact, the master must still answer /get_all_keys, and
# the revoked put's space comes back once the writer has exited.

STALL_SIZE = 24 * MiB
STALL_AT = 9 * MiB + 256 * 1024  # inside a copy chunk (1 MiB), not at its start
FILL_SIZE = 1 * MiB


def test_resumed_writer_damages_no_other_object(master_factory, transport):
    m = master_factory(extra_flags=["--client_ttl=2", "--put_start_release_timeout_sec=1"])
    s = connect(m)
    baseline = len(fill(s, "base/"))
    assert s.remove_all(force=True) == baseline
    s.close()
    w = f = c = None
    try:
        mark = log_size(m)
        w, wc = _start(W.stalled_writer, m.address, "stall/big", STALL_SIZE, STALL_AT)
        _expect(wc, "blocked")
        os.kill(w.pid, signal.SIGSTOP)
        wait_for_log(m, r"revoked unfinished put of 'stall/big'",
                     "the stopped writer's put to be revoked past --client_ttl", start=mark)
        # Past the release timeout (counted from the put's start): a master
        # that frees on time alone has freed the extent by now.
        time.sleep(1.5)
        f, fc = _start(W.filler, m.address, "pinned/", FILL_SIZE)
        _, keys = _expect(fc, "filled", 120)
        f.join(30)
        assert keys, "the filler stored nothing"
        # Room for the writer's next put, whatever the pool's geometry left
        # over after the last pinned object (a full pool of hard pins would
        # rightly refuse it): one pinned object goes.
        s = connect(m)
        assert s.remove(keys.pop(), force=True) == 0
        s.close()

        os.kill(w.pid, signal.SIGCONT)
        wc.send("release")
        _, rc, after = _expect(wc, "done", 60)
        assert rc != 0, "the revoked put returned 0"
        assert after == 0, f"the resumed writer's next put returned {after}"
        w.join(30)

        c, cc = _start(W.check_objects, m.address, keys, FILL_SIZE)
        _, bad = _expect(cc, "checked", 120)
        c.join(30)
        assert m.proc.poll() is None, f"the master died; log:\n{m.log_tail()}"
        listed = urllib.request.urlopen(m.metrics_url + "/get_all_keys", timeout=30).read().decode()
        assert not bad, (f"{len(bad)} of {len(keys)} hard-pinned objects were damaged by the "
                         f"resumed writer, e.g. {bad[:5]}")
        assert set(keys) <= set(listed.splitlines()), "/get_all_keys misses stored keys"
        # The writer is gone now: its quarantined extent is released.
        s = connect(m)
        s.remove_all(force=True)
        wait_for_space_back(s, baseline, m, "quarantine of the revoked put after its writer exited")
        s.close()
    finally:
        _kill(w, f, c)


# ---------------------------------------------------------------------------
# Item: a resumed, reclaimed client and the client that took its slot.
#
# A puts in a loop over the rings; the test SIGSTOPs it at a random moment
# (usually inside a ring call), waits until the master reclaims its slot,
# starts B, which gets the same slot (and rings), and resumes A while B puts.
# A must re-attach on its own (or fail a put with a clear code); B's puts all
# succeed, none times out, and every value reads back as written (a reply
# taken by the wrong client would publish one client's bytes under the
# other's key). Repeated to catch the race.

ITERATIONS = 4
B_PUTS = 200


def test_resumed_reclaimed_client_does_not_share_rings(master_factory, monkeypatch):
    monkeypatch.setenv("MC_CXL_RPC", "ring")
    monkeypatch.setenv("MC_CXL_RPC_TIMEOUT_MS", "3000")  # a lost reply shows as -901 soon
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    m = master_factory(extra_flags=["--client_ttl=2"])
    a, ac = _start(W.ring_client_a, m.address)
    bs = []
    try:
        _expect(ac, "attached")
        for it in range(ITERATIONS):
            time.sleep(rng.uniform(0.05, 0.4))  # A puts meanwhile
            slot = _slot_of(m, a.pid)
            mark = log_size(m)
            os.kill(a.pid, signal.SIGSTOP)
            wait_for_log(m, rf"client slot {slot} reclaimed", f"seed {seed} iteration {it}: A to be reclaimed",
                         start=mark)
            # Stopped inside a ring call, A keeps its rings (the slot is
            # retired); stopped between calls, B gets A's old slot and rings.
            in_call = re.search(rf"client slot {slot} \(pid {a.pid}\) retired inside a ring call",
                                m.log_tail(1 << 30)[mark:]) is not None
            b, bc = _start(W.ring_client_b, m.address, f"b{it}/", B_PUTS)
            bs.append((b, bc))
            _expect(bc, "attached")
            if in_call:
                assert _slot_of(m, b.pid) != slot, f"seed {seed}: B got slot {slot}, retired for A's ring call"
            else:
                assert _slot_of(m, b.pid) == slot, f"seed {seed}: B did not get A's old slot {slot}"
            bc.send("go")
            time.sleep(rng.uniform(0, 0.02))
            os.kill(a.pid, signal.SIGCONT)
            _, res = _expect(bc, "results", 120)
            bad = [r for r in res if r[1] != 0 or not r[2]]
            assert not bad, (f"seed {seed} iteration {it}: {len(bad)} of B's {len(res)} puts failed or "
                             f"read back wrong, e.g. {bad[:5]}; master log:\n{m.log_tail(3000)}")
        ac.send("stop")
        _, ares = _expect(ac, "results", 120)
        wrong = [r for r in ares if not r[2]]
        assert not wrong, f"seed {seed}: A read back wrong values for {wrong[:5]}"
        codes = {rc for _, rc, _ in ares}
        assert codes <= {0, TRANSFER_FAIL}, (
            f"seed {seed}: A's puts returned {sorted(codes)}; only 0 or a revoked copy (-800) expected")
        assert ares and ares[-1][1] == 0, f"seed {seed}: A's puts did not resume: {ares[-5:]}"
        assert m.proc.poll() is None
    finally:
        for b, bc in bs:
            if b.is_alive():
                bc.send("exit")
        _kill(a, *[b for b, _ in bs])
