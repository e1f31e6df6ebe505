"""Groups move together across the tiers: objects put with one
group id (ReplicateConfig.group_ids: K and V, TP shards) are demoted
together by eviction, promoted together (a member crossing the admission
threshold, or staged by a reader that cannot open the tier directory,
brings its disk-resident group members back too), and dropped together by
a tier over its capacity. The writer, the readers and the master are
separate processes; values are checksummed."""

from conftest import connect, metrics, value_for, wait_until
from mooncake_cxl import ReplicateConfig
from test_tiering import tier_flags
from tier_workers import read_all

POOL = 16 << 20
SIZE = 128 << 10
MEMBERS = 4


def put_groups(s, prefix, groups):
    for g in range(groups):
        keys = [f"{prefix}{g}_{j}" for j in range(MEMBERS)]
        cfg = ReplicateConfig()
        cfg.group_ids = [f"{prefix}grp{g}"] * MEMBERS
        assert s.put_batch(keys, [value_for(k, SIZE) for k in keys], cfg) == 0


def where(s, key):
    d = s.get_replica_desc(key)
    if not d:
        return "gone"
    return "disk" if d[0].is_disk_replica() else "pool"


def placements(s, prefix, groups):
    return {g: [where(s, f"{prefix}{g}_{j}") for j in range(MEMBERS)] for g in range(groups)}


def split_groups(pl):
    return [g for g, w in pl.items() if len(set(w)) != 1]


def idle_placements(m, s, prefix, groups):
    """placements() read while the tier thread had nothing queued or in hand
    and nothing moved (no demotion, tier drop or pool eviction) meanwhile: a
    group being moved shows split until its last member is through."""
    moves = ("mooncake_cxl_tier_queue", "mooncake_cxl_tier_demotions_total", "mooncake_cxl_tier_evictions_total",
             "master_evicted_key_count")

    def snapshot():
        before = [metrics(m).get(k, 0) for k in moves]
        pl = placements(s, prefix, groups)
        return pl if before[0] == 0 and [metrics(m).get(k, 0) for k in moves] == before else None

    return wait_until(snapshot, "placements read while the tier was idle", master=m)


def test_groups_demote_and_promote_together(master_factory, tier_dir, children):  # noqa: F811
    m = master_factory(pool_size=POOL, extra_flags=tier_flags(
        tier_dir, "--promotion_on_hit", "--promotion_admission_threshold=2"))
    s = connect(m)
    groups = 2 * POOL // (SIZE * MEMBERS)  # twice the pool: about half demoted
    put_groups(s, "g", groups)
    pl = idle_placements(m, s, "g", groups)
    assert not split_groups(pl), f"groups split across the tiers by demotion: {[(g, pl[g]) for g in split_groups(pl)][:5]}"
    on_disk = [g for g, w in pl.items() if w[0] == "disk"]
    assert len(on_disk) >= groups // 4
    # Room under the watermark for a group's promotion.
    for g, w in pl.items():
        if w[0] == "pool" and g > groups - 6:
            assert s.batch_remove([f"g{g}_{j}" for j in range(MEMBERS)], True) == [0] * MEMBERS
    # Promotion on hit: a reader process reads one member twice (the
    # threshold); the whole group comes back to the pool.
    g = on_disk[0]
    key = f"g{g}_0"
    for _ in range(2):
        missing, bad, _ = children(read_all, m.address, f"g{g}_", 1, SIZE).result()
        assert (missing, bad) == (0, 0)
    wait_until(lambda: all(w == "pool" for w in placements(s, "g", groups)[g]), f"group {g} promoted with {key}")
    assert metrics(m)["mooncake_cxl_tier_group_promotions_total"] >= MEMBERS - 1
    # Stage: a reader that cannot open the tier directory asks the master to
    # stage one member; its group members come too.
    g2 = on_disk[1]
    missing, bad, _ = children(read_all, m.address, f"g{g2}_", 1, SIZE, {"MC_CXL_TIER_DIRECT_READ": "0"}).result()
    assert (missing, bad) == (0, 0)
    wait_until(lambda: all(w == "pool" for w in placements(s, "g", groups)[g2]), f"group {g2} staged together")
    # Every value intact wherever it lives.
    for gg in range(groups):
        for j in range(MEMBERS):
            k = f"g{gg}_{j}"
            v = s.get(k)
            assert not v or v == value_for(k, SIZE), k
    assert metrics(m).get("mooncake_cxl_tier_checksum_failures_total", 0) == 0
    s.close()


def test_a_full_tier_drops_groups_whole(master_factory, tier_dir):  # noqa: F811
    # A tier of 8 MiB under a 16 MiB pool: putting 4x the pool overflows both,
    # and the tier drops its least recently used objects, group by group.
    m = master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir, f"--offload_capacity_bytes={8 << 20}"))
    s = connect(m)
    groups = 4 * POOL // (SIZE * MEMBERS)
    put_groups(s, "d", groups)
    pl = idle_placements(m, s, "d", groups)
    assert metrics(m)["mooncake_cxl_tier_evictions_total"] > 0, "the tier never overflowed"
    assert any(w[0] == "gone" for w in pl.values())
    split = split_groups(pl)
    assert not split, f"groups split by the tier's drops: {[(g, pl[g]) for g in split][:5]}"
    s.close()
