"""An index full of disk-resident entries: with the SSD tier on, values that
left the pool keep their index entries (kOnDisk stubs), so puts that keep
coming fill the index with stubs while the data region holds only the
newest values. Index pressure then drops the least recently used stubs,
entry and SSD record (a miss is safe), and every new put is accepted."""
from conftest import connect, counter, metrics, value_for, wait_until

POOL = 16 << 20
INDEX = 1024  # entries: a few hundred 64 KiB values fill the data region, stubs the rest
SIZE = 64 << 10
BATCH = 64


def test_an_index_of_disk_stubs_drops_its_oldest_and_takes_every_new_put(master_factory, tier_dir):
    m = master_factory(pool_size=POOL, extra_flags=[
        "--enable_offload", f"--root_fs_dir={tier_dir}", "--offload_on_evict", f"--index_capacity={INDEX}"])
    s = connect(m)
    try:
        mm = metrics(m)
        cap = mm["master_index_capacity"]
        watermark = mm["mooncake_cxl_index_high_watermark_ratio"]
        assert cap == INDEX
        n = 0
        while n < 3 * cap:
            keys = [f"stub/{n + i}" for i in range(BATCH)]
            rc = s.put_batch(keys, [value_for(k, SIZE) for k in keys])
            assert rc == 0, f"put_batch at {n} objects returned {rc}"
            n += BATCH
            mm = metrics(m)
            assert mm["mooncake_cxl_index_entries_in_use"] <= watermark * cap + BATCH, n
        # The index filled with stubs: disk-resident objects were dropped for it,
        # their records with them.
        assert counter(mm, "mooncake_cxl_index_evicted_disk_keys_total") > 0
        wait_until(lambda: metrics(m)["mooncake_cxl_tier_queue"] == 0, "the tier to drain its queue", master=m)
        wait_until(lambda: metrics(m)["mooncake_cxl_tier_records"] <= watermark * cap,
                   "the dropped stubs' records to go", master=m)
        # Oldest first: the newest batch reads back intact, the first is gone
        # from both tiers.
        for k in (f"stub/{i}" for i in range(n - BATCH, n)):
            assert s.get(k) == value_for(k, SIZE), k
        assert not any(s.is_exist(f"stub/{i}") == 1 for i in range(BATCH))
    finally:
        s.close()
