"""Announcement channels as a shared resource (announce.h, master_announce.cc):
names are the tenant's (two tenants' "prefill-0" are two channels: neither
reads nor blocks the other); every Announcer and Listener holds its channel
until close() or its client's end, and a channel nobody holds whose producer
is gone is reused for other names, also after a SIGKILL; one client holds at
most --announce_channels_per_client; when nothing is free the open fails
with NO_AVAILABLE_HANDLE (-200) naming why, and the store stays usable."""
import pytest

from channel_workers import channel_client
from conftest import connect, counter, metrics, wait_until
from mooncake_cxl.kv.announce import Announcer, Listener, request_key
from mooncake_cxl.kv.cache import KVCacheError

NO_HANDLE = -200


def _call(child, *cmd):
    child.conn.send(cmd)
    return child.recv()


def _start(children, master, tenant="default"):
    c = children(channel_client, master.address, tenant)
    assert c.recv() == ("ready", 0)
    return c


def test_two_tenants_same_channel_name_are_two_channels(master, children):
    a, b = _start(children, master, "alpha"), _start(children, master, "beta")
    # B listens first, then both produce on "prefill-0": neither is refused (-705).
    assert _call(b, "listen", "prefill-0") == 0
    assert _call(a, "listen", "prefill-0") == 0
    assert _call(a, "announce", "prefill-0") == 0
    assert _call(b, "announce", "prefill-0") == 0
    assert _call(a, "publish", "prefill-0", "req-a", 0, 128) == 0
    assert _call(b, "publish", "prefill-0", "req-b", 0, 7) == 0
    assert _call(a, "publish", "prefill-0", "req-a", 128, 256) == 1
    got_a, lost_a = _call(a, "poll", "prefill-0")
    got_b, lost_b = _call(b, "poll", "prefill-0")
    assert got_a == [(request_key("req-a"), 0, 128), (request_key("req-a"), 128, 256)] and not lost_a
    assert got_b == [(request_key("req-b"), 0, 7)] and not lost_b
    # The default tenant's "prefill-0" is a third channel.
    s = connect(master)
    try:
        with Listener(s, "prefill-0") as lis, Announcer(s, "prefill-0"):
            assert lis.poll() == []
    finally:
        s.close()
    for c in (a, b):
        _call(c, "stop")


def test_channels_of_a_sigkilled_client_are_reclaimed(master_factory, children):
    m = master_factory(extra_flags=["--announce_channels=8"])
    hog = _start(children, m)
    assert _call(hog, "announce", "made-up-producer") == 0
    assert _call(hog, "open_many", "made-up-", 7) == (7, 0)  # every channel held
    s = connect(m)
    try:
        with pytest.raises(KVCacheError) as e:
            Listener(s, "late")
        assert e.value.code == NO_HANDLE and "no announcement channel free" in str(e.value)
        assert s.put("still-usable", b"x") == 0 and s.get("still-usable") == b"x"
        hog.kill()
        # The master reclaims the slot of the dead process, and with it its channels.
        wait_until(lambda: counter(metrics(m), "mooncake_cxl_announce_channels_freed") >= 8,
                   "the killed client's channels to be freed", master=m)
        ours = [Listener(s, f"after-{i}") for i in range(8)]  # every channel again
        assert len(ours) == 8
        with pytest.raises(KVCacheError) as e:
            Listener(s, "one-too-many")
        assert e.value.code == NO_HANDLE
        for lis in ours:
            lis.close()
        with Announcer(s, "after-close") as ann:  # closed channels are free again
            assert ann.blocks_ready("r", 0, 1) == 0
    finally:
        s.close()


def test_per_client_cap_and_reuse_after_close(master_factory, children):
    m = master_factory(extra_flags=["--announce_channels=32", "--announce_channels_per_client=4"])
    s = connect(m)
    try:
        held = [Listener(s, f"cap-{i}") for i in range(4)]
        with pytest.raises(KVCacheError) as e:
            Listener(s, "cap-4")
        assert e.value.code == NO_HANDLE and "announce_channels_per_client" in str(e.value)
        assert counter(metrics(m), "mooncake_cxl_announce_refusals") >= 1
        other = _start(children, m)  # the cap is per client: another one is not refused
        assert _call(other, "open_many", "other-", 4) == (4, 0)
        assert _call(other, "open_many", "more-", 1) == (0, NO_HANDLE)
        held.pop().close()
        held.append(Listener(s, "cap-4"))  # a closed hold makes room
        for lis in held:
            lis.close()
        for i in range(12):  # far more names than this client may hold at once, one at a time
            with Listener(s, f"churn-{i}"):
                pass
        # A client that closes its store (not its listeners) drops every hold.
        _call(other, "stop")
        other.proc.join(60)
        wait_until(lambda: metrics(m)["mooncake_cxl_announce_channels_in_use"] == 0,
                   "the exited client's channels to be freed", master=m)
    finally:
        s.close()


def test_a_consumer_of_a_dead_producer_still_reads_its_records(master, children):
    """A channel freed after its producer died keeps its records until another
    name needs it: a consumer that comes later learns what was published."""
    p = _start(children, master)
    assert _call(p, "announce", "kept") == 0
    assert _call(p, "publish", "kept", "req-1", 0, 4) == 0
    p.kill()
    wait_until(lambda: counter(metrics(master), "mooncake_cxl_announce_channels_freed") >= 1,
               "the dead producer's channel to be freed", master=master)
    s = connect(master)
    try:
        with Listener(s, "kept") as lis:
            got = lis.poll()
            assert [(a.first, a.end) for a in got] == [(0, 4)] and lis.producer_dead
    finally:
        s.close()


def test_channels_survive_a_master_restart_and_dead_holders_are_dropped(master_factory, children):
    """A SIGKILLed and restarted master finds the channels and who held them
    in the pool: a live producer's channel keeps its name and records (a new
    listener reads both records, the one from before and the one after the
    restart), and the holds of a client killed while no master ran are
    dropped, so its channels are reused."""
    m1 = master_factory(extra_flags=["--announce_channels=8"])
    a = _start(children, m1)
    assert _call(a, "announce", "kept") == 0
    assert _call(a, "listen", "kept") == 0
    assert _call(a, "publish", "kept", "req-1", 0, 4) == 0
    dead = _start(children, m1)
    assert _call(dead, "open_many", "gone-", 7) == (7, 0)  # with "kept": every channel
    m1.kill()
    dead.kill()
    m2 = master_factory(format=False, extra_flags=["--announce_channels=8", f"--rpc_port={m1.port}"])
    assert _call(a, "publish", "kept", "req-1", 4, 8) == 1  # one-sided: no master needed
    s = connect(m2)
    try:
        wait_until(lambda: counter(metrics(m2), "mooncake_cxl_announce_channels_freed") >= 7,
                   "the dead client's recovered holds to be dropped", master=m2)
        with Listener(s, "kept") as lis:
            assert [(x.first, x.end) for x in lis.poll()] == [(0, 4), (4, 8)]
        fresh = [Listener(s, f"new-{i}") for i in range(7)]  # the dead client's channels, reused
        with pytest.raises(KVCacheError) as e:
            Listener(s, "one-too-many")  # "kept" is still held by its live producer
        assert e.value.code == NO_HANDLE
        for lis in fresh:
            lis.close()
        got, lost = _call(a, "poll", "kept")
        assert [(first, end) for _, first, end in got] == [(0, 4), (4, 8)] and not lost
    finally:
        s.close()
