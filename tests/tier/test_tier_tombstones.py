"""No resurrection of removed or overwritten keys (SSD tier): an
acknowledged remove, batch remove, remove_all, remove_by_regex or upsert of a
disk-resident key returns only once the tombstone of the old record is
written (tier_manager.h, "Removal"), so a master SIGKILLed
right after the acknowledgement and restarted with --format (the pool
formatted anew, the index rebuilt from the segment files alone) never serves
the removed key or the old value again. Real processes: the master is a
separate process killed with SIGKILL microseconds after the call returned,
while another client process keeps putting (the tier thread is busy with
demotion writes, so a tombstone written "soon" would lose the race);
several rounds. Pool-only keys get no ticket (no wait): checked by the
metrics of a remove of a key that never left the pool."""
import os
import signal

from conftest import connect, metrics, value_for
from test_tiering import disk_keys, tier_flags, wait_idle
from tier_tomb_workers import keep_putting

POOL = 16 << 20
SIZE = 128 << 10
ROUNDS = 4


def kill(m):
    os.kill(m.proc.pid, signal.SIGKILL)
    m.proc.wait()


def fill(s, prefix, n):
    for i in range(n):
        assert s.put(f"{prefix}{i}", value_for(f"{prefix}{i}", SIZE)) == 0


def busy_tier(children, m, prefix):
    """A client process putting values: their demotions keep the tier thread busy."""
    c = children(keep_putting, m.address, prefix, SIZE, 30)
    msg = c.recv()
    assert msg == "going", msg
    return c


def test_removed_and_upserted_disk_keys_never_come_back(master_factory, tier_dir, children):  # noqa: F811
    flags = tier_flags(tier_dir)
    m = master_factory(pool_size=POOL, extra_flags=flags)
    n = 2 * POOL // SIZE  # twice the pool: about half of it demoted
    gone, old_values = set(), {}  # removed keys; upserted key -> its old value (must never come back)
    kept = []  # disk-resident keys nobody touched: the rebuild must find them
    for rnd in range(ROUNDS):
        prefix = f"r{rnd}_"
        s = connect(m)
        fill(s, prefix, n)
        wait_idle(m)
        on_disk = disk_keys(s, prefix, n)
        assert len(on_disk) >= 20, f"round {rnd}: only {len(on_disk)} keys demoted"
        # The last 5 stay untouched; the batch removed last is most of the rest.
        singles, ups, batch, kept = on_disk[:3], on_disk[3:6], on_disk[6:-5], on_disk[-5:]
        writer = busy_tier(children, m, f"bg{rnd}_")
        for k in ups:
            old_values[k] = value_for(k, SIZE)
            assert s.upsert(k, value_for("new:" + k, SIZE // 2)) == 0
        for k in singles:
            assert s.remove(k, True) == 0
        gone.update(singles)
        # The last acknowledgement of the round, then SIGKILL at once.
        if rnd % 2 == 0:
            assert s.batch_remove(batch, True) == [0] * len(batch)
        else:
            assert s.remove_by_regex("|".join(f"^{k}$" for k in batch), True) == len(batch)
        kill(m)
        writer.kill()
        gone.update(batch)
        s.close()
        m = master_factory(pool_size=POOL, format=True, extra_flags=flags)
        s = connect(m)
        back = [k for k in gone if s.is_exist(k) == 1 or s.get(k)]
        assert not back, f"round {rnd}: removed keys came back after SIGKILL + --format: {back[:10]}"
        stale = [k for k, v in old_values.items() if s.get(k) == v]
        assert not stale, f"round {rnd}: old values of upserted keys came back: {stale[:10]}"
        for k in old_values:  # missing (the new value was pool-only) or the new value, never the old one
            v = s.get(k)
            assert not v or v == value_for("new:" + k, SIZE // 2), k
        lost = [k for k in kept if s.get(k) != value_for(k, SIZE)]
        assert not lost, f"round {rnd}: untouched disk-resident keys not rebuilt: {lost}"
        assert metrics(m).get("mooncake_cxl_tier_checksum_failures_total", 0) == 0
        s.close()


def test_remove_all_then_sigkill_and_format_leaves_nothing(master_factory, tier_dir, children):  # noqa: F811
    flags = tier_flags(tier_dir)
    m = master_factory(pool_size=POOL, extra_flags=flags)
    n = 2 * POOL // SIZE
    for rnd in range(2):
        prefix = f"a{rnd}_"
        s = connect(m)
        fill(s, prefix, n)
        wait_idle(m)
        assert len(disk_keys(s, prefix, n)) >= n // 4
        writer = busy_tier(children, m, f"bg{rnd}_")
        left = s.remove_all(True)
        kill(m)
        writer.kill()
        assert left >= n, left  # ours and some of the writer's
        s.close()
        m = master_factory(pool_size=POOL, format=True, extra_flags=flags)
        s = connect(m)
        back = [f"{prefix}{i}" for i in range(n) if s.is_exist(f"{prefix}{i}") == 1]
        assert not back, f"round {rnd}: {len(back)} keys back after remove_all + SIGKILL + --format: {back[:10]}"
        s.close()


def test_upsert_batch_and_put_after_remove_never_bring_old_values_back(master_factory, tier_dir, children,  # noqa: F811
                                                                        monkeypatch):
    """Puts of keys whose disk record was just removed, then one upsert_batch
    of disk-resident keys as the last acknowledgement, SIGKILL, --format:
    no removed or overwritten value comes back (the new value or nothing is
    served); a remove of a pool-only key gets no ticket (nothing to wait for).
    The master's tombstone writes are slowed (a test hook: 30 ms before each
    group), so an acknowledgement sent before its tombstone is written would
    lose the race every time."""
    flags = tier_flags(tier_dir)
    monkeypatch.setenv("MCXL_TIER_TEST_TOMB_DELAY_MS", "30")
    m = master_factory(pool_size=POOL, extra_flags=flags)
    monkeypatch.delenv("MCXL_TIER_TEST_TOMB_DELAY_MS")
    n = 2 * POOL // SIZE
    s = connect(m)
    fill(s, "p", n)
    wait_idle(m)
    on_disk = disk_keys(s, "p", n)
    assert len(on_disk) >= 60
    assert s.get_replica_desc(f"p{n - 1}")[0].is_memory_replica()  # the newest never left the pool
    durable = metrics(m).get("mooncake_cxl_tier_tombstones_durable", 0)
    assert s.remove(f"p{n - 1}", True) == 0
    assert metrics(m).get("mooncake_cxl_tier_tombstones_durable", 0) == durable  # no tombstone, no wait
    writer = busy_tier(children, m, "bg")
    again, ups = on_disk[:20], on_disk[20:60]
    assert s.batch_remove(again, True) == [0] * len(again)
    for k in again:
        assert s.put(k, value_for("again:" + k, SIZE)) == 0
    assert s.upsert_batch(ups, [value_for("new:" + k, SIZE) for k in ups]) == 0
    kill(m)
    writer.kill()
    s.close()
    m = master_factory(pool_size=POOL, format=True, extra_flags=flags)
    s = connect(m)
    for prefix, keys in (("again:", again), ("new:", ups)):
        for k in keys:
            v = s.get(k)
            assert v != value_for(k, SIZE), f"{k}: the old value came back"
            assert not v or v == value_for(prefix + k, SIZE), k
    assert s.is_exist(f"p{n - 1}") != 1
    s.close()
