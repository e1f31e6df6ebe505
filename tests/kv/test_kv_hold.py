"""Hold until consumed (mooncake_cxl.kv: save(..., hold=s), load(..., release=True)):
blocks a prefill announced survive an eviction storm by other processes
(several times the pool) while their consumer has not loaded them, also after
the prefill exited; they become evictable once consumed, or once the hold's
deadline passes when no consumer comes. Not held: evicted by the first storm."""
import time

import kv_hold_workers as H
from conftest import WAIT_TIMEOUT, connect, wait_for_leases_to_lapse

POOL = 64 << 20
LEASE_MS = 200  # the master's read lease here: a released hold lapses this fast


def storm(children, address, tag):
    """Two processes putting 2 x 2 pools' worth of new 1 MiB objects; asserts
    they forced eviction (their first objects are gone again)."""
    fl = [children(H.flood, address, f"{tag}-{i}", 2 * POOL) for i in range(2)]
    res = [f.result() for f in fl]
    assert sum(ok for ok, _ in res) > 3 * POOL // (1 << 20), res
    return res


def object_keys(store, seed, n):
    """The pool keys of the objects a prefill of request `seed` stores."""
    cache = H.make_cache(store)
    return [stem + "/g0" for _, _, stem in cache.stored_prefix(cache.block_hashes(H.request(cache, seed, n, 3))).objects]


def test_announced_blocks_survive_eviction_until_consumed_or_deadline(master_factory, children):
    m = master_factory(pool_size=POOL, extra_flags=[f"--default_kv_lease_ttl={LEASE_MS}"])
    n = 32  # 2 MiB per request
    hold_b = 15.0
    # A: held 120 s and announced; its consumer comes later. B: held hold_b s,
    # no consumer ever comes. C: not held. Every producer has exited.
    children(H.prefill, m.address, 1, n, 120.0, "hold-a").result()
    t_b = time.monotonic()
    children(H.prefill, m.address, 2, n, hold_b).result()
    children(H.prefill, m.address, 3, n, None).result()
    s = connect(m)
    storm(children, m.address, "storm1")
    storm_done = time.monotonic()
    assert s.batch_is_exist(["storm1-0/0", "storm1-1/0"]) == [0, 0]  # the storm wrapped the pool
    a, total = children(H.present, m.address, 1, n).result()
    assert a == total == 8, (a, total)
    if storm_done - t_b < hold_b - 1:  # (a machine slower than that passed B's deadline already)
        assert children(H.present, m.address, 2, n).result()[0] == 8
    assert children(H.present, m.address, 3, n).result()[0] == 0  # not held: evicted
    # Past B's deadline, a second storm evicts B; A (still unconsumed) stays.
    wait_for_leases_to_lapse(m, object_keys(s, 2, n), timeout=hold_b + WAIT_TIMEOUT)
    storm(children, m.address, "storm2")
    assert children(H.present, m.address, 2, n).result()[0] == 0
    assert children(H.present, m.address, 1, n).result()[0] == 8
    # The consumer loads A through the channel (every byte checked) and releases it.
    d = children(H.decode, m.address, 1, n, "hold-a").result()
    assert d["loaded"] == n and d["bad"] == 0 and "error" not in d, d
    wait_for_leases_to_lapse(m, object_keys(s, 1, n))
    storm(children, m.address, "storm3")
    assert children(H.present, m.address, 1, n).result()[0] == 0  # consumed: evictable again
    s.close()


def test_hold_refuses_unforced_remove_and_reports_missing(master_factory):
    """A held object is leased: remove() without force is refused (-706); a
    hold of objects that are not stored holds nothing."""
    m = master_factory(pool_size=POOL, extra_flags=[f"--default_kv_lease_ttl={LEASE_MS}"])
    s = connect(m)
    cache = H.make_cache(s)
    hashes = cache.block_hashes(H.request(cache, 4, 6))
    cache.register(cache.layout.allocate(8))
    assert cache.save(hashes, range(6), hold=60.0) == 2  # (0..3), (4..5)
    p = cache.stored_prefix(hashes)
    assert cache.lookup(hashes).objects == p.objects
    # Lookup's own read lease lapses (a probe read after it has a later one);
    # the hold does not.
    assert s.put("probe", b"p") == 0 and s.get("probe") == b"p"
    wait_for_leases_to_lapse(m, ["probe"])
    assert cache.remove(p) == 0
    assert s.remove(p.objects[0][2] + "/g0") == -706
    assert cache.release(p) == 2
    wait_for_leases_to_lapse(m, [stem + "/g0" for _, _, stem in p.objects])
    assert cache.remove(p) == 2
    assert cache.hold(hashes, 60.0) == 0 and cache.release(p) == 0
    s.close()
