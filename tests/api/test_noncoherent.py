"""A pool formatted --coherence=noncoherent (CXL 2.0 sharing without
cross-host coherence; docs/architecture.md section 7): one writer per shared
line, the master as the serialiser. The client writes and writes back its
value, the master publishes it (kPublish); readers never write an index entry,
their leases reach the master as kLeases; holds and releases too. The same
API answers; what differs is which requests the master sees, checked here on
its per-type request counters."""
import pytest

from conftest import NONCOHERENT_RUN, connect, counter, lease_remaining_ms, metrics, wait_until

HAS_LEASE = -706


def requests(master, op):
    return counter(metrics(master), f"master_{op}_requests_total")


@pytest.fixture(params=["coherent", "noncoherent"])
def coherence(request):
    return request.param


def test_publish_and_leases_go_through_the_master_only_when_noncoherent(master_factory, coherence, transport):
    m = master_factory(extra_flags=[f"--coherence={coherence}"])
    s = connect(m)
    try:
        before = requests(m, "publish"), requests(m, "leases")
        assert s.put("k", b"v" * 5000) == 0
        assert s.put_batch([f"b{i}" for i in range(20)], [bytes([i]) * (100 + i) for i in range(20)]) == 0
        assert s.upsert("k", b"w" * 7000) == 0
        assert s.get("k") == b"w" * 7000
        assert s.get_batch([f"b{i}" for i in range(20)]) == [bytes([i]) * (100 + i) for i in range(20)]
        # A read's lease, then this client's own unforced remove: refused,
        # whichever way the lease reached the entry.
        assert s.remove("k") == HAS_LEASE
        publishes, leases = requests(m, "publish") - before[0], requests(m, "leases") - before[1]
        if coherence == "noncoherent":
            assert publishes == 3, "a kPublish per put call (put, put_batch, upsert)"
            assert leases >= 1
        else:
            assert publishes == 0 and leases == 0, "a coherent pool's clients CAS the entry themselves"
        assert s.remove("k", force=True) == 0 and s.get("k") == b""
    finally:
        s.close()


@pytest.fixture
def nc_store(master_factory):
    """(master, store) on a fresh non-coherent pool; the store closed after."""
    m = master_factory(extra_flags=["--coherence=noncoherent"])
    s = connect(m)
    yield m, s
    s.close()


def test_read_lease_reaches_the_master_without_a_remove(nc_store):
    """The lease thread sends a read's lease on its own: /query_key shows it."""
    m, s = nc_store
    assert s.put("leased", b"x" * 100) == 0
    assert lease_remaining_ms(m, "leased") == 0
    assert s.get("leased") == b"x" * 100
    wait_until(lambda: lease_remaining_ms(m, "leased") > 0, "the read's lease on the master", master=m)


def test_holds_and_releases_on_a_noncoherent_pool(nc_store):
    import time
    m, s = nc_store
    assert s.put("held", b"h" * 100) == 0
    until = time.time_ns() + 600 * 10**9  # a deadline (the stimulus), not a wait
    assert s._hold(["held", "absent"], until) == [0, -704]
    assert lease_remaining_ms(m, "held") > 60_000
    assert s.remove("held") == HAS_LEASE
    assert s._release_hold(["held"]) == [0]
    assert lease_remaining_ms(m, "held") < 60_000


def test_two_processes_share_a_noncoherent_pool(master_factory, children):
    """A writer process and a reader process: what one publishes through the
    master the other reads one-sidedly."""
    from noncoherent_workers import read_all, write_all
    m = master_factory(extra_flags=["--coherence=noncoherent"])
    w = children(write_all, m.address, 200)
    assert w.result() == 200
    r = children(read_all, m.address, 200)
    assert r.result() == 200


@pytest.mark.skipif(not NONCOHERENT_RUN, reason="checks the MCXL_TEST_COHERENCE switch itself")
def test_the_suite_switch_formats_noncoherent(master):
    assert "is non-coherent" in master.log_tail(1 << 20)


def test_batch_is_exist_sends_its_lease_to_the_master(nc_store):
    """Every read kind queues its lease for the master (kLeases), batch_is_exist too:
    a client of a non-coherent pool never writes an index entry."""
    m, s = nc_store
    assert s.put("probed", b"p" * 100) == 0
    before = requests(m, "leases")
    assert s.batch_is_exist(["probed"]) == [1]
    assert s.remove("probed") == HAS_LEASE  # the remove flushes the queued lease first
    assert requests(m, "leases") > before
