"""Fast paths: batch_get_into as one client call (every key
looked up first, one counter update per batch), eviction ahead of the
watermark reusing its sorted window across rounds, and the benchmark's
summary of the four figures."""
import numpy as np

from conftest import connect, counter, metrics, wait_until
from mooncake_cxl.bench import summary

OBJECT_NOT_FOUND, INVALID_PARAMS = -704, -600


def test_batch_get_into_mixed_keys_and_read_counters(master):
    s = connect(master)
    try:
        vals = {f"b{i}": bytes([i + 1]) * (4096 + i * 500) for i in range(6)}
        for k, v in vals.items():
            assert s.put(k, v) == 0
        keys = ["b0", "missing", "b2", "b3", "b4", "b5"]
        bufs = [np.zeros(8192, dtype=np.uint8) for _ in keys]
        sizes = [8192] * len(keys)
        sizes[2] = 100  # too small for b2's value
        before = metrics(master)
        r = s.batch_get_into(keys, [b.ctypes.data for b in bufs], sizes)
        assert r == [len(vals["b0"]), OBJECT_NOT_FOUND, INVALID_PARAMS, len(vals["b3"]), len(vals["b4"]),
                     len(vals["b5"])]
        for k, b, n in zip(keys, bufs, r):
            if n > 0:
                assert bytes(b[:n]) == vals[k], k
        assert not bufs[2].any(), "a refused destination was written"
        after = metrics(master)
        assert counter(after, "master_get_hits_total") - counter(before, "master_get_hits_total") == 4
        assert counter(after, "master_get_misses_total") - counter(before, "master_get_misses_total") == 1
        # The same keys again after an upsert: the new value, never the old one.
        assert s.upsert("b3", b"\x77" * 5000) == 0
        r = s.batch_get_into(["b3", "b0"], [bufs[0].ctypes.data, bufs[1].ctypes.data], [8192, 8192])
        assert r == [5000, len(vals["b0"])] and bytes(bufs[0][:5000]) == b"\x77" * 5000
        # Mismatched lists: every key refused, nothing read.
        assert s.batch_get_into(["b0", "b1"], [bufs[0].ctypes.data], [8192]) == [INVALID_PARAMS] * 2
    finally:
        s.close()


def test_object_read_after_the_window_was_sampled_is_not_evicted(master_factory):
    # Oldest first: block A, then the hot objects, then block B. The first
    # ahead round samples all of them and evicts part of A; the hot objects
    # are read only afterwards, so the window (reused by later rounds) still
    # ranks them as old: their fresh lease must protect them.
    pool, value = 64 << 20, 256 << 10
    m = master_factory(pool_size=pool, extra_flags=["--eviction_high_watermark_ratio=0.9", "--eviction_ratio=0.2"])
    s = connect(m)
    try:
        cap = metrics(m)["master_total_capacity_bytes"]
        per = int(cap // value)
        n = 0

        def put(prefix, count):
            nonlocal n
            for _ in range(count):
                assert s.put(f"{prefix}{n}", b"v" * value) == 0
                n += 1

        put("a", per // 3)
        hot = [f"hot{i}" for i in range(8)]
        for k in hot:
            assert s.put(k, b"h" * value) == 0
        put("b", int(per * 0.6))  # past watermark - ratio/2: ahead rounds start
        # Idle: the ring server evicts ahead (its first round samples the window).
        wait_until(lambda: counter(metrics(m), "master_evicted_key_count") > 0, "a first eviction round", master=m)
        for k in hot:
            assert s.is_exist(k) == 1  # leased from now on
        put("c", per)  # many more rounds, some on the kept window
        assert all(s.get(k) == b"h" * value for k in hot), "a leased object was evicted"
        assert s.is_exist("a0") == 0
        assert counter(metrics(m), "master_evicted_key_count") > per // 3
    finally:
        s.close()


def test_summary_prints_every_figure_with_its_baseline():
    KIB, MIB = 1 << 10, 1 << 20
    rows = [
        {"op": "put", "size": 4 * KIB, "median_us": 3.0, "memcpy_median_us": 0.1},
        {"op": "batch_get_into 32x64 KiB vs anonymous memcpy", "size": 2 * MIB, "median_us": 100.0,
         "memcpy_median_us": 95.0, "vs_memcpy": 0.95},
        {"op": "put", "size": 4 * MIB, "p99_over_median": 2.0, "memcpy_p99_us": 300.0, "memcpy_median_us": 200.0,
         "samples": 200},
        {"op": "put", "size": 16 * MIB, "p99_over_median": 2.5, "memcpy_p99_us": 1500.0,
         "memcpy_median_us": 1000.0, "samples": 200},
    ]
    text = summary.markdown({
        "data": {"rows": rows},
        "control": {"rows": [{"op": "ping", "ring_median_us": 1.0}]},
        "eviction": {"eviction_cost": 0.08, "put_64k_half_empty_gbps": 5.0, "put_64k_at_watermark_gbps": 4.6},
    })
    lines = text.splitlines()
    assert len(lines) == 2 + 5, text
    assert "ring ping 1.00 µs" in lines[2] and "0.95×" in lines[3]
    assert "1.5×" in lines[5] and "8%" in lines[6]
    assert summary.markdown({}) == ""
