"""Leases, pins, groups and watermark eviction, observed through the master's
monitoring port (/metrics parsed with prometheus_client's parser)."""
import re
import urllib.error
import urllib.request

import pytest

from conftest import connect, counter, metrics, wait_for_leases_to_lapse
from mooncake_cxl import ReplicateConfig, SoftPinAction

POOL = 64 << 20
VALUE = 512 << 10
HIGH = 0.9


def start(master_factory, *flags):
    return master_factory(pool_size=POOL, extra_flags=["--eviction_high_watermark_ratio=%s" % HIGH,
                                                       "--eviction_ratio=0.1", *flags])


def test_three_times_the_pool_every_put_succeeds_and_lru_goes_first(master_factory):
    m = start(master_factory)
    s = connect(m)
    try:
        cap = metrics(m)["master_total_capacity_bytes"]
        n = int(3 * cap // VALUE)
        peak = 0.0
        for i in range(n):
            assert s.put(f"obj{i}", bytes([i % 251]) * VALUE) == 0, f"put {i} of {n} failed"
            mm = metrics(m)
            peak = max(peak, mm["master_allocated_bytes"] / cap)
            # Never above the watermark plus one object.
            assert mm["master_allocated_bytes"] <= HIGH * cap + VALUE + 4096, (i, mm["master_allocated_bytes"])
        mm = metrics(m)
        assert counter(mm, "master_evicted_key_count") > 0
        assert counter(mm, "master_successful_evictions_total") > 0
        # Oldest gone, newest kept, and what is kept is intact.
        present = [s.is_exist(f"obj{i}") for i in range(n)]
        assert present[0] == 0 and present[n // 3] == 0
        assert all(present[-5:])
        first_kept = present.index(1)
        assert all(present[first_kept:]), "eviction did not follow put order (LRU)"
        assert s.get(f"obj{n - 1}") == bytes([(n - 1) % 251]) * VALUE
        assert "[evict] round" in m.log_tail(200000)
    finally:
        s.close()


def test_recently_read_objects_survive(master_factory):
    m = start(master_factory)
    s = connect(m)
    try:
        cap = metrics(m)["master_total_capacity_bytes"]
        for i in range(10):
            assert s.put(f"hot{i}", b"h" * VALUE) == 0
        for i in range(int(2 * cap // VALUE)):
            for j in range(10):  # reading keeps them leased and recent
                assert s.is_exist(f"hot{j}") == 1
            assert s.put(f"cold{i}", b"c" * VALUE) == 0
        assert all(s.get(f"hot{j}") == b"h" * VALUE for j in range(10))
        assert s.is_exist("cold0") == 0
    finally:
        s.close()


def test_leased_pinned_and_viewed_objects_are_never_evicted(master_factory):
    m = start(master_factory, "--default_kv_lease_ttl=60000")
    s = connect(m)
    try:
        cap = metrics(m)["master_total_capacity_bytes"]
        hard = ReplicateConfig()
        hard.with_hard_pin = True
        assert s.put("hard", b"H" * VALUE, hard) == 0
        assert s.put("leased", b"L" * VALUE) == 0
        s.get("leased")  # a 60 s lease
        assert s.put("viewed", b"V" * VALUE) == 0
        view = s.get_buffer("viewed")
        for i in range(int(2 * cap // VALUE)):
            assert s.put(f"filler{i}", b"f" * VALUE) == 0
        assert s.get("hard") == b"H" * VALUE
        assert s.get("leased") == b"L" * VALUE
        assert bytes(view) == b"V" * VALUE and s.is_exist("viewed") == 1
        assert s.is_exist("filler0") == 0
    finally:
        s.close()


def test_a_group_is_never_split(master_factory):
    m = start(master_factory)
    s = connect(m)
    try:
        cap = metrics(m)["master_total_capacity_bytes"]
        groups = int(2 * cap // (2 * VALUE))
        for g in range(groups):
            cfg = ReplicateConfig()
            cfg.group_ids = [f"req{g}", f"req{g}"]  # one group id per key: K and V together
            assert s.put_batch([f"req{g}/k", f"req{g}/v"], [b"k" * VALUE, b"v" * VALUE], cfg) == 0
        for g in range(groups):
            k, v = s.is_exist(f"req{g}/k"), s.is_exist(f"req{g}/v")
            assert k == v, f"group req{g} split: K present={k}, V present={v}"
        assert s.is_exist("req0/k") == 0 and s.is_exist(f"req{groups - 1}/k") == 1
    finally:
        s.close()


@pytest.mark.parametrize("allow", [True, False])
def test_soft_pinned_objects_go_last(master_factory, allow, monkeypatch):
    monkeypatch.setenv("MC_CXL_PUT_WAIT_MS", "300")
    # Short leases: the is_exist checks below must not protect what they look at.
    m = start(master_factory, f"--allow_evict_soft_pinned_objects={'true' if allow else 'false'}",
              "--default_kv_lease_ttl=20")
    s = connect(m)
    try:
        cap = metrics(m)["master_total_capacity_bytes"]
        soft = ReplicateConfig()
        soft.soft_pin_action = SoftPinAction.ENABLE
        n_soft = int(0.5 * cap // VALUE)
        for i in range(n_soft):
            assert s.put(f"soft{i}", b"s" * VALUE, soft) == 0
        # Plain objects come and go while the soft-pinned ones stay.
        for i in range(int(cap // VALUE)):
            assert s.put(f"plain{i}", b"p" * VALUE) == 0
        assert all(s.is_exist(f"soft{i}") for i in range(n_soft))
        wait_for_leases_to_lapse(m)
        # Now ask for more than the plain objects can give back.
        big = ReplicateConfig()
        big.with_hard_pin = True
        results = [s.put(f"big{i}", b"b" * VALUE, big) for i in range(int(0.6 * cap // VALUE))]
        if allow:
            assert all(r == 0 for r in results), (results, m.log_tail(3000))
            assert not all(s.is_exist(f"soft{i}") for i in range(n_soft))
        else:
            assert -200 in results  # nothing else to evict: a clear -200
            assert all(s.is_exist(f"soft{i}") for i in range(n_soft))
    finally:
        s.close()


def test_metrics_parse_and_count_hits_and_misses(master):
    s = connect(master)
    try:
        assert s.put("k", b"v") == 0
        s.get("k")
        s.get("k")
        s.get("nope")
        mm = metrics(master)
        assert counter(mm, "master_get_hits_total") == 2
        assert counter(mm, "master_get_misses_total") == 1
        assert mm["master_key_count"] == 1
        assert mm[("master_objects", (("state", "complete"),))] == 1
        assert counter(mm, "master_put_start_requests_total") >= 1
        assert mm["master_client_count"] == 1
        summary = urllib.request.urlopen(master.metrics_url + "/metrics/summary").read().decode()
        assert "Keys: 1" in summary and "Hit rate: 66.7%" in summary
    finally:
        s.close()


def test_http_endpoints_and_bad_requests(master):
    s = connect(master)
    try:
        assert s.put("a b", b"x" * 10) == 0
        get = lambda p: urllib.request.urlopen(master.metrics_url + p, timeout=10)
        assert b'"size_":10' in get("/query_key?key=a%20b").read()
        assert get("/get_all_keys").read().decode().splitlines() == ["a b"]
        assert master.pool_path in get("/get_all_segments").read().decode()
        assert get("/health").status == 200
        for path, code in (("/no/such/path", 404), ("/query_key", 400), ("/query_key?key=nope", 404),
                           ("/query_key?key=%zz", 400), ("/metrics?" + "x" * 20000, 414)):
            with pytest.raises(urllib.error.HTTPError) as e:
                get(path)
            assert e.value.code == code, path
        assert "master_key_count 1" in get("/metrics").read().decode()  # still serving
    finally:
        s.close()


def test_eviction_round_is_logged(master_factory):
    m = start(master_factory)
    s = connect(m)
    try:
        for i in range(int(1.5 * POOL // VALUE)):
            assert s.put(f"o{i}", b"o" * VALUE) == 0
        line = [l for l in m.log_tail(100000).splitlines() if "[evict] round" in l][-1]
        assert re.search(r"used [\d.]+% -> [\d.]+%, index [\d.]+% in use, evicted \d+ objects, \d+ bytes in "
                         r"[\d.]+ ms", line), line
    finally:
        s.close()
