"""Small values: the object index is a capacity like the data region. Past
--index_high_watermark_ratio puts evict (least recently used first) for
index slots, while the data region stays nearly empty, and nothing makes a
put wait: observed through /metrics and the master's log."""
import pytest

from conftest import connect, counter, metrics
from mooncake_cxl.launch import MasterError

POOL = 64 << 20  # the default index: one entry per 4 KiB, 16,384 entries
BATCH = 1000
VALUE = b"t" * 64


def index_load(m):
    mm = metrics(m)
    return mm, mm["mooncake_cxl_index_entries_in_use"], mm["master_index_capacity"]


# MC_CXL_PUT_WAIT_MS=0 (no_put_wait): a put the master cannot place at once
# returns its wait-out code (-200 / busy) instead of retrying: "0 ms" is the
# longest any put of this test may wait.
def test_tiny_values_to_3x_the_index_every_put_succeeds_none_waits_over_0ms(master_factory, transport,
                                                                            no_put_wait):
    m = master_factory(pool_size=POOL)
    s = connect(m)
    try:
        mm, _, cap = index_load(m)
        watermark = mm["mooncake_cxl_index_high_watermark_ratio"]
        assert watermark == pytest.approx(0.8)
        n = 0
        while n < 3 * cap:
            keys = [f"tiny/{n + i}" for i in range(BATCH)]
            rc = s.put_batch(keys, [VALUE] * BATCH)
            assert rc == 0, f"put_batch at {n} objects returned {rc}"
            n += BATCH
            mm, used, _ = index_load(m)
            # Never past the watermark by more than one batch.
            assert used <= watermark * cap + BATCH, (n, used)
        assert counter(mm, "master_put_object_failures_total") == 0
        evicted = counter(mm, "mooncake_cxl_index_evicted_keys_total")
        assert evicted >= n - watermark * cap
        # Every eviction was for the index: the data region never got near its watermark.
        assert evicted == counter(mm, "master_evicted_key_count")
        assert mm["master_allocated_bytes"] < 0.1 * mm["master_total_capacity_bytes"]
        # Probes stay within the index's bound however full it got.
        assert mm["mooncake_cxl_index_max_probe"] < 64
        # A sample of the puts' lookups (one in 16), every one within 64 slots.
        assert mm[("mooncake_cxl_index_probe_length_bucket", (("le", "64"), ("op", "put_lookup")))] == n // 16
        # Oldest first: the newest batch is there, the first one gone.
        assert all(s.is_exist(f"tiny/{i}") == 1 for i in range(n - BATCH, n))
        assert s.get(f"tiny/{n - 1}") == VALUE
        assert not any(s.is_exist(f"tiny/{i}") == 1 for i in range(BATCH))
        # Said once, naming the flag that makes room and the size that filled it.
        log = m.log_tail(400000)
        lines = [l for l in log.splitlines() if "drives eviction" in l]
        assert len(lines) == 1, lines
        assert "--index_capacity" in lines[0] and "objects average" in lines[0]
    finally:
        s.close()


def test_index_watermark_flag_is_honoured_and_checked(master_factory):
    m = master_factory(pool_size=POOL, extra_flags=["--index_high_watermark_ratio=0.5"])
    s = connect(m)
    try:
        _, _, cap = index_load(m)
        for b in range(0, int(cap), BATCH):
            assert s.put_batch([f"half/{b + i}" for i in range(BATCH)], [VALUE] * BATCH) == 0
        mm, used, _ = index_load(m)
        assert used <= 0.5 * cap
        assert counter(mm, "mooncake_cxl_index_evicted_keys_total") > 0
        assert "index high watermark" in m.log_tail(400000)
    finally:
        s.close()
    with pytest.raises(MasterError):
        master_factory(pool_size=POOL, extra_flags=["--index_high_watermark_ratio=0.99"])
