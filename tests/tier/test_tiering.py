"""The SSD tier under the pool: offload on eviction and write-through,
one index for both tiers (reads find disk-resident objects one-sidedly and
read the record themselves, or have the master stage it), promotion on hit,
removal / upsert of disk-resident keys, restarts (SIGKILL, --format rebuild),
a full tier, a corrupted segment byte. Values are checksummed (value_for);
writers and readers are separate processes where it matters."""
import glob
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from conftest import connect, metrics, value_for, wait_until
from tier_workers import put_many, read_all

POOL = 16 << 20
SIZE = 256 << 10  # 5x the pool: 320 values


def tier_metric(master, name):
    return metrics(master).get("mooncake_cxl_tier_" + name, 0)


def wait_idle(master):
    wait_until(lambda: tier_metric(master, "queue") == 0, "the tier thread to drain its queue", master=master)


def tier_flags(tier_dir, *more, evict=True):
    return ["--enable_offload", f"--root_fs_dir={tier_dir}"] + (["--offload_on_evict"] if evict else []) + list(more)


def disk_keys(store, prefix, count):
    out = []
    for i in range(count):
        d = store.get_replica_desc(f"{prefix}{i}")
        if d and d[0].is_disk_replica():
            out.append(f"{prefix}{i}")
    return out


def test_fill_5x_offload_on_evict_every_value_intact(master_factory, tier_dir, children):
    m = master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir))
    n = 5 * POOL // SIZE
    rcs = children(put_many, m.address, "f", n, SIZE).result()
    assert rcs == [0] * n
    wait_idle(m)
    missing, bad, disk_reads = children(read_all, m.address, "f", n, SIZE).result()
    assert (missing, bad) == (0, 0)
    assert disk_reads >= n // 2  # most of it was only on disk
    mm = metrics(m)
    assert mm["mooncake_cxl_tier_demotions_total"] >= n // 2
    assert mm["mooncake_cxl_tier_objects"] >= n // 2
    assert mm["mooncake_cxl_tier_disk_hits_total"] >= disk_reads
    assert mm["mooncake_cxl_tier_checksum_failures_total"] == 0
    s = connect(m)
    d = s.get_replica_desc("f0")
    assert len(d) == 1 and d[0].is_disk_replica() and not d[0].is_memory_replica()
    assert d[0].get_disk_descriptor().object_size == SIZE
    last = s.get_replica_desc(f"f{n - 1}")
    assert last[0].is_memory_replica()
    assert s.batch_get_replica_desc(["f0", "nope"]).keys() == {"f0"}
    assert s.is_exist("f0") == 1 and s.get_size("f0") == SIZE
    # get_into and batch_get_into of disk-resident keys
    import numpy as np
    buf = np.zeros(SIZE, dtype=np.uint8)
    assert s.get_into("f1", buf.ctypes.data, buf.nbytes) == SIZE
    assert buf.tobytes() == value_for("f1", SIZE)
    bufs = [np.zeros(SIZE, dtype=np.uint8) for _ in range(3)]
    r = s.batch_get_into(["f2", "f3", "f4"], [b.ctypes.data for b in bufs], [SIZE] * 3)
    assert r == [SIZE] * 3
    assert all(b.tobytes() == value_for(k, SIZE) for b, k in zip(bufs, ["f2", "f3", "f4"]))
    s.close()


def fill_and_check_nothing_on_disk(m, share, size):
    """Puts `share` of the pool in values of `size`: no tier write, no record,
    every key a memory replica, no disk read."""
    s = connect(m)
    n = int(share * metrics(m)["master_total_capacity_bytes"]) // size
    for i in range(n):
        assert s.put(f"w{i}", value_for(f"w{i}", size)) == 0
    time.sleep(0.3)  # lets a tier thread that would write show it
    mm = metrics(m)
    assert mm["mooncake_cxl_tier_writes_total"] == 0 and mm["mooncake_cxl_tier_records"] == 0
    assert all(s.get_replica_desc(f"w{i}")[0].is_memory_replica() for i in range(n))
    assert s.get_offload_rpc_read_count() == 0
    s.close()


def test_below_the_watermark_nothing_reaches_the_disk(master_factory, tier_dir):
    fill_and_check_nothing_on_disk(master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir)), 0.6, SIZE)


def test_promotion_on_hit_then_served_from_the_pool(master_factory, tier_dir):
    m = master_factory(pool_size=POOL, extra_flags=tier_flags(
        tier_dir, "--promotion_on_hit", "--promotion_admission_threshold=2"))
    s = connect(m)
    n = 2 * POOL // SIZE
    for i in range(n):
        assert s.put(f"p{i}", value_for(f"p{i}", SIZE)) == 0
    wait_idle(m)
    key = disk_keys(s, "p", 8)[0]
    # Make room under the watermark so that the promotion has space.
    for i in range(n - 20, n):
        s.remove(f"p{i}", True)
    assert s.get(key) == value_for(key, SIZE)
    assert s.get_offload_rpc_read_count() == 1
    assert s.get_replica_desc(key)[0].is_disk_replica()  # one read: below the threshold
    assert s.get(key) == value_for(key, SIZE)  # the read that crosses it is served from disk
    assert s.get_offload_rpc_read_count() == 2
    wait_until(lambda: s.get_replica_desc(key)[0].is_memory_replica(), "the promotion")
    assert s.get(key) == value_for(key, SIZE)
    assert s.get_offload_rpc_read_count() == 2  # served from the pool
    assert tier_metric(m, "promotions_total") >= 1
    s.close()


def test_write_through(master_factory, tier_dir, children):
    m = master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir, evict=False))
    s = connect(m)
    for i in range(10):
        assert s.put(f"t{i}", value_for(f"t{i}", SIZE)) == 0
    wait_until(lambda: tier_metric(m, "records") == 10, "ten write-through records")
    assert all(s.get_replica_desc(f"t{i}")[0].is_memory_replica() for i in range(10))  # still in the pool too
    assert tier_metric(m, "demotions_total") == 0
    n = 3 * POOL // SIZE
    assert children(put_many, m.address, "u", n, SIZE).result() == [0] * n
    wait_idle(m)
    missing, bad, _ = children(read_all, m.address, "t", 10, SIZE).result()
    assert (missing, bad) == (0, 0)
    missing, bad, _ = children(read_all, m.address, "u", n, SIZE).result()
    assert (missing, bad) == (0, 0)
    assert tier_metric(m, "demotions_total") > 0  # eviction only converted: the copies were there
    s.close()


def test_staged_reads_when_the_tier_is_not_readable(master_factory, tier_dir, children):
    m = master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir))
    n = 2 * POOL // SIZE
    assert children(put_many, m.address, "s", n, SIZE).result() == [0] * n
    wait_idle(m)
    missing, bad, disk_reads = children(read_all, m.address, "s", 10, SIZE,
                                        {"MC_CXL_TIER_DIRECT_READ": "0"}).result()
    assert (missing, bad, disk_reads) == (0, 0, 0)  # staged into the pool by the master
    assert tier_metric(m, "promotions_total") >= 5


def test_remove_upsert_and_restarts_keep_the_disk_tier(master_factory, tier_dir, pool_path):
    flags = tier_flags(tier_dir)
    m = master_factory(pool_size=POOL, extra_flags=flags)
    s = connect(m)
    n = 3 * POOL // SIZE
    for i in range(n):
        assert s.put(f"r{i}", value_for(f"r{i}", SIZE)) == 0
    wait_idle(m)
    on_disk = disk_keys(s, "r", n // 2)
    assert len(on_disk) >= 10
    gone, upserted, regexed = on_disk[0], on_disk[1], on_disk[2:5]
    assert s.remove(gone, True) == 0
    assert s.is_exist(gone) == 0 and s.get(gone) == b""
    new = value_for("new:" + upserted, SIZE // 2)
    assert s.upsert(upserted, new) == 0
    assert s.get(upserted) == new
    pattern = "^(" + "|".join(re.escape(k) for k in regexed) + ")$"
    assert s.remove_by_regex(pattern, True) == 3
    assert all(s.is_exist(k) == 0 for k in regexed)
    assert s.put(on_disk[5], b"x") == 0  # exists: not overwritten (counts as success)
    assert s.get(on_disk[5]) == value_for(on_disk[5], SIZE)
    wait_idle(m)
    kept = [k for k in on_disk[5:]]
    s.close()

    def check(store, formatted=False):
        assert store.is_exist(gone) == 0 and all(store.is_exist(k) == 0 for k in regexed)
        if formatted:  # the upsert's value was only in the pool: gone with it; the old one stays dead
            assert store.get(upserted) in (b"", new)
        else:
            assert store.get(upserted) == new
        for k in kept:
            assert store.get(k) == value_for(k, SIZE), k

    # SIGKILL + restart on the same pool: the disk-resident entries stay.
    m.kill()
    m2 = master_factory(pool_size=POOL, format=False, extra_flags=flags)
    s = connect(m2)
    check(s)
    assert s.get_replica_desc(kept[0])[0].is_disk_replica()
    s.close()
    wait_idle(m2)
    m2.kill()
    # A pool formatted anew: the index entries are rebuilt from the segment
    # files; removed keys stay removed (tombstones), the upsert's value wins.
    m3 = master_factory(pool_size=POOL, format=True, extra_flags=flags)
    assert tier_metric(m3, "rebuilt_objects") >= len(kept)
    s = connect(m3)
    check(s, formatted=True)
    assert s.put("after-format", b"v" * 100) == 0  # generations seeded above the tier's
    assert s.get("after-format") == b"v" * 100
    s.close()


def test_master_sigkill_during_offload_loses_no_acknowledged_value(master_factory, tier_dir):
    flags = tier_flags(tier_dir)
    m = master_factory(pool_size=POOL, extra_flags=flags)
    s = connect(m)
    acked, stop = [], threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            k = f"k{i}"
            if s.put(k, value_for(k, SIZE)) != 0:
                return
            acked.append(k)
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    wait_until(lambda: len(acked) > 3 * POOL // SIZE, "offload under way")
    os.kill(m.proc.pid, signal.SIGKILL)  # while demotions are in flight
    stop.set()
    t.join(timeout=60)
    m.proc.wait()
    s.close()
    m2 = master_factory(pool_size=POOL, format=False, extra_flags=flags)
    s = connect(m2)
    for k in acked:
        assert s.get(k) == value_for(k, SIZE), k
    assert tier_metric(m2, "checksum_failures_total") == 0
    s.close()


def _full_tier(master_factory, tier_dir, flags):
    m = master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir, *flags))
    s = connect(m)
    n = 5 * POOL // SIZE
    for i in range(n):
        assert s.put(f"x{i}", value_for(f"x{i}", SIZE)) == 0  # the pool keeps working
    wait_idle(m)
    present = 0
    for i in range(n):
        v = s.get(f"x{i}")
        if v:
            assert v == value_for(f"x{i}", SIZE)
            present += 1
    assert present < n  # some were dropped: the tier could not hold them all
    assert present >= POOL // SIZE // 2
    mm = metrics(m)
    assert mm["mooncake_cxl_tier_evictions_total"] + mm["mooncake_cxl_tier_demotion_failures_total"] > 0
    s.close()
    return m


def test_full_tier_by_capacity_flag(master_factory, tier_dir):
    _full_tier(master_factory, tier_dir, ["--offload_capacity_bytes=%d" % (POOL // 2)])


def test_full_tier_on_a_small_tmpfs(master_factory, tier_dir):
    os.makedirs(tier_dir)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", tier_dir], capture_output=True)
    if r.returncode != 0:
        pytest.skip("a tmpfs cannot be mounted here (needs root): the capacity-flag test covers a full tier")
    try:
        m = _full_tier(master_factory, tier_dir, [])
        assert "failed" in m.log_tail(200000)  # the append's clear code, logged
        m.stop()
    finally:
        subprocess.run(["umount", "-l", tier_dir])


def test_corrupt_segment_byte_is_a_miss(master_factory, tier_dir):
    m = master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir))
    s = connect(m)
    n = 2 * POOL // SIZE
    for i in range(n):
        assert s.put(f"c{i}", value_for(f"c{i}", SIZE)) == 0
    wait_idle(m)
    victim, other = disk_keys(s, "c", 6)[:2]
    needle = value_for(victim, SIZE)[:4096]
    for path in glob.glob(os.path.join(tier_dir, "seg-*.mcxl")):
        with open(path, "r+b") as f:
            data = f.read()
            at = data.find(needle)
            if at >= 0:
                f.seek(at + 100)
                f.write(bytes([data[at + 100] ^ 0xFF]))
                break
    else:
        pytest.fail("record not found in the segment files")
    assert s.get(victim) == b""  # a miss, never wrong bytes
    assert s.get(other) == value_for(other, SIZE)
    assert tier_metric(m, "checksum_failures_total") >= 1
    s.close()
