"""Pre-demotion (--offload_ahead_ratio): with offload on eviction,
once the pool's bytes without a disk copy pass the ahead threshold the tier
thread writes clean copies of the coldest objects in the background, keeping
them in the pool; eviction at the watermark then only converts them.

What must hold: copies reach the disk before the pool reaches the watermark
(tier writes grow while nothing was evicted), and below the threshold nothing
does; evicted values read back intact from another process; an object
overwritten or removed while its copy is written never reads back its old
bytes (several writer processes that overwrite and remove their own keys in
the order the ahead copies pick them, then everything pushed out to the disk,
read from another process, and again after a master SIGKILL and restart).
Values are checksummed (value_for); no timing is asserted."""
import random
import time

import pytest

from conftest import connect, metrics, open_store, value_for, wait_for_leases_to_lapse, wait_until
from test_tiering import fill_and_check_nothing_on_disk, tier_flags, wait_idle
from tier_workers import put_many, read_all

POOL = 16 << 20
SIZE = 256 << 10


def m_(master, name):
    return metrics(master).get(name, 0)


def test_copies_reach_the_disk_before_the_watermark(master_factory, tier_dir, children):
    m = master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir, "--offload_ahead_ratio=0.3"))
    cap = metrics(m)["master_total_capacity_bytes"]
    n = int(0.75 * cap) // SIZE  # below the 0.9 watermark: no eviction
    assert children(put_many, m.address, "a", n, SIZE).result() == [0] * n
    # Clean copies of the oldest objects until at most 30% of the pool has none.
    wait_until(lambda: metrics(m)["mooncake_cxl_tier_pool_clean_bytes"] >=
             metrics(m)["master_allocated_bytes"] - 0.3 * cap - SIZE, "the ahead copies")
    wait_idle(m)
    mm = metrics(m)
    assert mm["master_key_count"] == n and mm["master_evicted_key_count"] == 0
    assert mm["mooncake_cxl_tier_writes_total"] > 0
    assert mm["mooncake_cxl_tier_ahead_writes_total"] == mm["mooncake_cxl_tier_writes_total"]
    assert mm["mooncake_cxl_tier_demotions_total"] == 0 and mm["mooncake_cxl_tier_objects"] == 0
    assert mm["mooncake_cxl_tier_records"] == mm["mooncake_cxl_tier_writes_total"]
    # Not more than needed: about (used - 30%) of the pool, never every object.
    assert mm["mooncake_cxl_tier_writes_total"] < n
    s = connect(m)  # (no get_replica_desc before the burst: it grants leases, eviction skips those)
    # Burst past the watermark: eviction converts the clean copies.
    before = metrics(m)
    k = int(0.3 * cap) // SIZE
    for i in range(k):
        assert s.put(f"b{i}", value_for(f"b{i}", SIZE)) == 0
    wait_idle(m)
    mm = metrics(m)
    dem = mm["mooncake_cxl_tier_demotions_total"] - before["mooncake_cxl_tier_demotions_total"]
    clean = mm["mooncake_cxl_tier_demotions_clean_total"] - before["mooncake_cxl_tier_demotions_clean_total"]
    assert dem > 0
    assert clean >= 0.9 * dem, (clean, dem)  # the LRU objects were the copied ones
    assert s.get_replica_desc("a0")[0].is_disk_replica()
    s.close()
    missing, bad, disk_reads = children(read_all, m.address, "a", n, SIZE).result()
    assert (missing, bad) == (0, 0) and disk_reads >= dem - 1
    assert children(read_all, m.address, "b", k, SIZE).result()[:2] == (0, 0)
    assert metrics(m)["mooncake_cxl_tier_checksum_failures_total"] == 0


def test_below_the_ahead_threshold_nothing_reaches_the_disk(master_factory, tier_dir):
    m = master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir, "--offload_ahead_ratio=0.5"))
    fill_and_check_nothing_on_disk(m, 0.4, SIZE)


def test_ahead_ratio_rejected_out_of_range(master_factory, tier_dir):
    with pytest.raises(Exception):
        master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir, "--offload_ahead_ratio=1.5"))


def churn(conn, address, prefix, nkeys, rounds, size, seed):
    """Overwrites and removes its own keys round-robin (the least recently
    written key is the next one touched: the one the ahead copy picks).
    Returns key -> last acknowledged version (None: removed last)."""
    rng = random.Random(seed)
    s = open_store(address)
    state = {}
    for r in range(rounds):
        for i in range(nkeys):
            k = f"{prefix}{i}"
            if state.get(k) is not None and rng.random() < 0.2:
                if s.remove(k, True) == 0:
                    state[k] = None
                continue
            rc = s.upsert(k, value_for(f"{k}#{r}", size))
            if rc == 0:
                state[k] = r
            # A refused put (-200 at the watermark) changes nothing: the last
            # acknowledged version stays the value.
        time.sleep(0.01)  # a pause: pre-demotion copies while puts pause (then races the next round)
    s.close()
    return state


def check_keys(conn, address, expected, size):
    """(missing, old or foreign bytes, removed keys that came back)."""
    s = open_store(address)
    missing = wrong = resurrected = 0
    for k, ver in expected.items():
        v = s.get(k)
        if ver is None:
            resurrected += bool(v)
        elif not v:
            missing += 1
        elif v != value_for(f"{k}#{ver}", size):
            wrong += 1
    s.close()
    return missing, wrong, resurrected


def test_overwrite_and_remove_while_ahead_copy_is_written(master_factory, tier_dir, children, monkeypatch):
    size = 64 << 10
    # A pause before each tier write (test hook): objects change under their copies.
    monkeypatch.setenv("MCXL_TEST_TIER_WRITE_DELAY_MS", "20")
    # Short leases: the reads below must not keep the keys in the pool through the fill.
    flags = tier_flags(tier_dir, "--offload_ahead_ratio=0.1", "--default_kv_lease_ttl=50")
    pool = 2 * POOL  # room for the upserts' second values: no eviction while they churn
    m = master_factory(pool_size=pool, extra_flags=flags)
    cap = metrics(m)["master_total_capacity_bytes"]
    writers, nkeys = 3, int(0.4 * cap) // size // 3  # 40% of the pool live: ahead copies all the time
    ws = [children(churn, m.address, f"w{j}/", nkeys, 12, size, 1000 + j) for j in range(writers)]
    expected = {}
    for w in ws:
        expected.update(w.result())
    wait_idle(m)
    mm = metrics(m)
    assert mm["mooncake_cxl_tier_ahead_writes_total"] > 0
    assert mm["mooncake_cxl_tier_stale_copies_total"] > 0  # the race happened, and was caught
    assert sum(v is not None for v in expected.values()) > 0 and None in expected.values()
    # A miss only where eviction ran meanwhile (an upsert evicted before the
    # master settles it goes as without a tier); never old or foreign bytes,
    # never a removed key back.
    missing0, wrong, back = children(check_keys, m.address, expected, size).result()
    assert (wrong, back) == (0, 0)
    assert missing0 <= mm["master_evicted_key_count"]
    # Everything out to the disk (clean copies convert, others demote), then
    # read from another process: no stale record serves a key.
    wait_for_leases_to_lapse(m)  # the reads' leases would keep their objects in the pool
    assert children(put_many, m.address, "fill", 2 * int(cap) // size, size).result().count(0) > 0
    wait_idle(m)
    missing, wrong, back = children(check_keys, m.address, expected, size).result()
    assert (missing, wrong, back) == (missing0, 0, 0)
    mm = metrics(m)
    assert mm["mooncake_cxl_tier_objects"] > 0 and mm["mooncake_cxl_tier_disk_hits_total"] >= len(expected) // 2
    # A master SIGKILL and restart: entries and records agree again.
    m.kill()
    m2 = master_factory(pool_size=pool, format=False, extra_flags=flags)
    missing, wrong, back = children(check_keys, m2.address, expected, size).result()
    assert (missing, wrong, back) == (missing0, 0, 0)
    assert metrics(m2)["mooncake_cxl_tier_checksum_failures_total"] == 0
