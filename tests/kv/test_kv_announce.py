"""Announcement channels in the pool (mooncake_cxl.kv.announce over the
control library's announce.h): a decode process started before the prefill
loads each run as it is announced (acks flow back through another channel: no
TCP between them); lapped readers are told what they lost; one live producer
per channel, taken over after its process dies; a futex wait is woken across
processes."""
import os

import pytest

import kv_workers as W
from conftest import connect, wait_until
from mooncake_cxl.kv import Announcer, KVCacheError, Listener


def test_decode_streams_blocks_as_prefill_announces_them(master, children):
    bt = W.LAYOUT["block_tokens"]
    n_tokens = 10 * bt + 5  # 10 blocks: runs of 3 -> 4 announcements
    dec = children(W.streaming_decode, master.address, 3, 5, n_tokens, "pf", "pf-acks")
    assert dec.recv() == "listening"  # the decode is waiting before the prefill exists
    pre = children(W.streaming_prefill, master.address, 3, 5, n_tokens, "pf", "pf-acks")
    p = pre.result()
    d = dec.result()
    runs = [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert d == {"loaded": 10, "events": runs, "bad": 0, "lost": 0}, d
    # The prefill produced run k+1 only after the decode had loaded run k.
    assert p["acked"] == runs


def test_lapped_listener_is_told_and_resumes(master):
    s = connect(master)
    lis = Listener(s, "lap", from_start=True)
    ann = Announcer(s, "lap")
    slots = 512  # FormatOptions::announce_slots
    total = 3 * slots + 7
    for i in range(total):
        ann.blocks_ready("r", i, i + 1)
    got = lis.poll()
    assert lis.lost == total - slots
    assert [a.first for a in got] == list(range(total - slots, total))  # in order, none torn
    assert [a.number for a in got] == list(range(total - slots, total))
    assert lis.poll() == [] and lis.wait(timeout=0.05) == []
    ann.blocks_ready("r", 99, 100)
    assert [a.first for a in lis.wait(timeout=5)] == [99]
    ann.close()
    s.close()


def test_one_live_producer_per_channel_taken_over_after_death(master, children):
    held = children(W.hold_channel, master.address, "excl")
    assert held.recv() == "holding"
    s = connect(master)
    lis = Listener(s, "excl", from_start=True)
    assert lis.producer_pid == held.proc.pid
    with pytest.raises(KVCacheError) as e:
        Announcer(s, "excl")
    assert e.value.code == -705
    held.kill()
    ann = Announcer(s, "excl")  # the dead owner's claim is taken over
    ann.blocks_ready("after", 7, 8)
    got = lis.poll()
    # Record numbers continue across producers: the listener's cursor stays valid.
    assert [(a.number, a.first) for a in got] == [(0, 0), (1, 1), (2, 2), (3, 7)]
    ann.close()
    assert lis.producer_pid == 0
    again = Announcer(s, "excl")  # a released channel can be claimed again
    again.close()
    # Channels are per name: many names coexist.
    anns = [Announcer(s, f"name-{i}") for i in range(8)]
    for i, a in enumerate(anns):
        a.blocks_ready("x", i, i + 1)
    assert all([x.first for x in Listener(s, f"name-{i}").poll()] == [i] for i in range(8))
    for a in anns:
        a.close()
    s.close()


FUTEX = {"x86_64": 202, "aarch64": 98}  # syscall numbers


def in_futex_wait_on(pid, path):
    """Whether the main thread of `pid` sleeps in futex() on a word of its
    mapping of the file `path`, or of its simulated host's copy under
    MCXL_TEST_SIM_HOSTS (/proc/PID/syscall: number, then arguments)."""
    with open(f"/proc/{pid}/syscall") as f:
        fields = f.read().split()
    if not fields or fields[0] != str(FUTEX[os.uname().machine]):
        return False
    word = int(fields[1], 16)
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and (parts[5].strip() == path or parts[5].strip().startswith(path + ".simhost-")):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= word < hi:
                    return True
    return False


def test_futex_wait_is_woken_by_another_process(master, children):
    waiter = children(W.wait_one, master.address, "wake", 60)
    assert waiter.recv() == "waiting"
    wait_until(lambda: in_futex_wait_on(waiter.proc.pid, master.pool_path),
               "the waiter to pass its spin phase and sleep on the channel's futex")
    s = connect(master)
    ann = Announcer(s, "wake")
    ann.blocks_ready("w", 4, 5)
    assert waiter.result() == [(4, 5)]
    ann.close()
    s.close()
