"""SIGKILL of the master while the SSD tier compacts, at the
master level: the tier is filled through eviction (--offload_on_evict), most
disk-resident keys are removed so that more than half of the segment bytes
are garbage and the tier thread compacts (tier_manager.h), and the master is
SIGKILLed as soon as its log says a segment is being compacted (a few rounds,
each killed a little later). After each restart on the same pool and tier:
every key acknowledged and not removed reads back with its exact bytes (from
the pool or from a record the compaction moved or not), every removed key
stays removed, and no record fails its checksum."""
import os
import random
import signal
import time

from conftest import connect, metrics, value_for, wait_until
from test_tiering import tier_flags, wait_idle

POOL = 16 << 20
SIZE = 256 << 10
CAPACITY = 96 << 20  # segments of CAPACITY / 8 = 12 MiB (tier_manager.h); never full: nothing dropped
ROUNDS = 6


def compactions_logged_path(path):
    with open(path, errors="replace") as f:
        return sum("compacting segment" in line for line in f)


def compactions_logged(master):
    return compactions_logged_path(master.log_path)


def test_master_sigkill_during_compaction(master_factory, tier_dir):  # noqa: F811
    flags = tier_flags(tier_dir, f"--offload_capacity_bytes={CAPACITY}")
    rnd = random.Random(int(os.environ.get("MCXL_FAULT_SEED", "7")))
    m = master_factory(pool_size=POOL, extra_flags=flags)
    logs = [m.log_path]
    live, removed = {}, set()  # key -> value size; keys removed with rc 0
    n = 0
    killed_with_compaction = 0
    for rnd_i in range(ROUNDS):
        s = connect(m)
        batch = []
        for _ in range(2 * POOL // SIZE):  # 2x the pool: half of it and more demoted
            k = f"c{n}"
            n += 1
            assert s.put(k, value_for(k, SIZE)) == 0
            live[k] = SIZE
            batch.append(k)
        wait_idle(m)
        # Remove 85 % of this round's keys (disk-resident ones among them):
        # their records turn dead, the tier's garbage passes one half.
        before = compactions_logged(m)
        for k in batch:
            if rnd.random() < 0.85:
                assert s.remove(k, True) == 0, k
                del live[k]
                removed.add(k)
        # Kill while (or just after) the compaction runs: at the first log
        # line, after a random 0-12 ms (a segment takes ~5-20 ms on tmpfs).
        wait_until(lambda: compactions_logged(m) > before, "a compaction to start")
        time.sleep(rnd.uniform(0, 0.012))
        os.kill(m.proc.pid, signal.SIGKILL)
        m.proc.wait()
        killed_with_compaction += 1
        s.close()
        m = master_factory(pool_size=POOL, format=False, extra_flags=flags)
        logs.append(m.log_path)
        s = connect(m)
        bad = [k for k, size in live.items() if s.get(k) != value_for(k, size)]
        assert not bad, f"round {rnd_i}: {len(bad)} of {len(live)} acknowledged values lost or wrong: {bad[:10]}"
        back = [k for k in removed if s.is_exist(k) != 0]
        assert not back, f"round {rnd_i}: removed keys came back: {back[:10]}"
        mm = metrics(m)
        assert mm.get("mooncake_cxl_tier_checksum_failures_total", 0) == 0
        assert mm["mooncake_cxl_tier_objects"] > 0  # the survivors are still (partly) on disk
        assert mm.get("mooncake_cxl_tier_evictions_total", 0) == 0  # the tier dropped nothing: a miss is a loss
        s.close()
    assert killed_with_compaction == ROUNDS
    assert sum(compactions_logged_path(p) for p in logs) >= ROUNDS
    # The tier compacts again after the kills, and the values stay intact.
    s = connect(m)
    for k in list(live)[: len(live) // 2]:
        assert s.remove(k, True) == 0
        del live[k]
    wait_idle(m)
    assert all(s.get(k) == value_for(k, size) for k, size in live.items())
    assert metrics(m).get("mooncake_cxl_tier_checksum_failures_total", 0) == 0
    s.close()
    for name in os.listdir(os.path.dirname(m.log_path)):
        if name.startswith("master") and name.endswith(".log"):
            with open(os.path.join(os.path.dirname(m.log_path), name), errors="replace") as f:
                assert not [line for line in f if "failed its checksum" in line or "is corrupt" in line]
