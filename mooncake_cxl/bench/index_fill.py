"""Small values and the object index (section "index" of python -m mooncake_cxl.bench).

One client puts new keys with put_batch, 1,000 a call, from an empty pool to
three times the index's capacity, once with 64-byte values (only the index
fills: eviction for its slots) and once with 4 KiB values (the data region
and the index fill together), once the pool's background population is
done (its race with the first puts is the cold section's). Every batch is timed; the figures are each
batch against the median batch of the empty pool (the first 20 % of the
index) of the same run. Then the probe lengths the master measured
(/metrics: every put's lookup of its key, its insert, and the entries a
lookup finds) at 50, 80, 90 and 95 % load, filling a fresh index with the
watermark raised to 0.95 (no eviction before), and at the default watermark after 3x the
capacity (tombstones everywhere).
"""
import os
import re
import statistics
import time
import urllib.request

from . import common
from .common import KIB, MIB

BATCH = 1000
LOADS = (0.5, 0.8, 0.9, 0.95)
# Fill levels (objects put, in index capacities) the batch times are split by.
LEVELS = ((0, 0.5), (0.5, 0.8), (0.8, 1.0), (1.0, 2.0), (2.0, 3.0))
_SAMPLE = re.compile(r'^(\w+)(?:\{(.*)\})? (\S+)$')


def _metrics(url):
    out = {}
    for line in urllib.request.urlopen(url + "/metrics", timeout=60).read().decode().splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def _buckets(samples, name, op):
    """{le: cumulative count} of one histogram's op (le as int, +Inf as None)."""
    out = {}
    for (n, labels), v in samples.items():
        if n == name and f'op="{op}"' in labels:
            le = re.search(r'le="([^"]+)"', labels).group(1)
            out[None if le == "+Inf" else int(le)] = v
    return out


def _share(after, before=None):
    """Per bucket bound, the share of probes within it (counts since `before`)."""
    before = before or {}
    total = after.get(None, 0) - before.get(None, 0)
    if total <= 0:
        return {}
    return {le: (c - before.get(le, 0)) / total for le, c in after.items() if le is not None}


_POPULATED = re.compile(rb"\[master\] populated the pool")


def _wait_populated(master, store, timeout=120.0):
    """Until the master's and this client's background population are done:
    they race the first puts (a cold start, measured by the cold section),
    which here would be read as a cost of the fill level they happen at."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(master.log_path, "rb") as f:
            if _POPULATED.search(f.read()) and store._populated():
                return
        time.sleep(0.01)
    raise RuntimeError("the pool's background population did not finish")


def _fill(master, size, count, on_batch=None):
    s = common.connect(master.address)
    _wait_populated(master, s)
    value = b"v" * size
    times, n = [], 0
    try:
        while n < count:
            keys = [f"fill/{size}/{n + i}" for i in range(BATCH)]
            t0 = time.perf_counter()
            rc = s.put_batch(keys, [value] * BATCH)
            times.append(time.perf_counter() - t0)
            if rc != 0:
                raise RuntimeError(f"put_batch at {n} objects returned {rc}")
            n += BATCH
            if on_batch:
                on_batch(n)
    finally:
        s.close()
    return times


def _batches(size, pool_bytes, pool_dir):
    from ..launch import MasterProcess
    # Prefaulted (master and client), the population finished before the
    # first batch: first-touch page faults would weigh on the first batches
    # of 4 KiB values only, which are the baseline.
    with common.temp_pool("mcxl_bench_index", pool_dir) as path, \
            MasterProcess(path, pool_bytes, format=True, extra_flags=["--prefault_pool"]) as m:
        cap = int(_metrics(m.metrics_url)[("master_index_capacity", "")])
        before = {}

        def steady(n):  # the probes of the last third: the index at its watermark, tombstones in it
            if n == (2 * cap // BATCH) * BATCH:
                before.update(_metrics(m.metrics_url))
        times = _fill(m, size, 3 * cap, steady)
        after = _metrics(m.metrics_url)
    empty = statistics.median(times[:max(1, int(0.2 * cap) // BATCH)])
    return {
        "levels": _by_level(times, cap, empty),
        "value_bytes": size, "index_capacity": cap, "batch_s": times, "empty_batch_s": empty,
        "worst_ratio": max(times) / empty, "worst_batch_ms": max(times) * 1e3,
        "p99_ratio": sorted(times)[int(0.99 * (len(times) - 1))] / empty,
        "within_2x": sum(t <= 2 * empty for t in times) / len(times),
        "over_50ms": sum(t > 0.05 for t in times),
        "index_evicted": after.get(("mooncake_cxl_index_evicted_keys_total", ""), 0),
        "window_evicted": after.get(("mooncake_cxl_index_window_evictions_total", ""), 0),
        "evicted": after.get(("master_evicted_key_count", ""), 0),
        "steady_probes": {op: _share(_buckets(after, "mooncake_cxl_index_probe_length_bucket", op),
                                     _buckets(before, "mooncake_cxl_index_probe_length_bucket", op))
                          for op in ("put_lookup", "insert")},
        "steady_hit": _share(_buckets(after, "mooncake_cxl_index_hit_probe_entries_bucket", "hit")),
    }


def _by_level(times, cap, empty):
    """Per fill level: median, p99 and worst batch against the empty-pool batch."""
    out = []
    for lo, hi in LEVELS:
        seg = sorted(times[int(lo * cap) // BATCH:int(hi * cap) // BATCH])
        if seg:
            out.append({"from": lo, "to": hi, "median": seg[len(seg) // 2] / empty,
                        "p99": seg[int(0.99 * (len(seg) - 1))] / empty, "worst": seg[-1] / empty})
    return out


def _probes_by_load(pool_bytes, pool_dir):
    """Probe lengths as a fresh index fills to each of LOADS (watermark 0.95,
    eviction ahead of it only past 0.9495)."""
    from ..launch import MasterProcess
    out = []
    with common.temp_pool("mcxl_bench_probe", pool_dir) as path, \
            MasterProcess(path, pool_bytes, format=True,
                          extra_flags=["--index_high_watermark_ratio=0.95", "--eviction_ratio=0.001"]) as m:
        cap = int(_metrics(m.metrics_url)[("master_index_capacity", "")])
        s = common.connect(m.address)
        n, prev = 0, _metrics(m.metrics_url)
        try:
            for load in LOADS:
                target = int(load * cap)
                while n < target:  # the last batch of a level: its puts' probes are the level's
                    k = min(BATCH, target - n)
                    if n + k == target:
                        prev = _metrics(m.metrics_url)
                    if s.put_batch([f"p/{n + i}" for i in range(k)], [b"p" * 64] * k) != 0:
                        raise RuntimeError(f"put_batch at {n} objects failed")
                    n += k
                cur = _metrics(m.metrics_url)
                row = {"load": cur[("mooncake_cxl_index_load_ratio", "")]}
                for op in ("put_lookup", "insert"):
                    row[op] = _share(_buckets(cur, "mooncake_cxl_index_probe_length_bucket", op),
                                     _buckets(prev, "mooncake_cxl_index_probe_length_bucket", op))
                row["hit"] = _share(_buckets(cur, "mooncake_cxl_index_hit_probe_entries_bucket", "hit"))
                row["window_evicted"] = cur.get(("mooncake_cxl_index_window_evictions_total", ""), 0)
                out.append(row)
        finally:
            s.close()
    return out


def run(quick=False, pool_dir="/dev/shm"):
    pool_bytes = 64 * MIB if quick else 512 * MIB
    before = os.environ.get("MC_CXL_PREFAULT")
    os.environ["MC_CXL_PREFAULT"] = "1"  # this process's clients map the pool's pages at setup
    try:
        return {
            "pool_bytes": pool_bytes,
            "fills": [_batches(size, pool_bytes, pool_dir) for size in (64, 4 * KIB)],
            "probes": _probes_by_load(pool_bytes, pool_dir),
        }
    finally:
        if before is None:
            os.environ.pop("MC_CXL_PREFAULT")
        else:
            os.environ["MC_CXL_PREFAULT"] = before


def _dist(share):
    if not share:
        return "-"
    return " / ".join(f"{100 * share.get(le, 0):.0f}%" for le in (1, 4, 16, 64))


def markdown(r):
    lines = [f"Pool {r['pool_bytes'] // MIB} MiB (default index: one entry per 4 KiB), put_batch of {BATCH:,} "
             "new keys from empty to 3x the index's capacity, started once the pool's background population "
             "finished; each batch against the median batch of the empty pool, same run.", "",
             "| values | empty-pool batch | worst batch | worst / empty | p99 / empty | batches within 2x "
             "| batches over 50 ms | evicted for the index (of which in a full probe window) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for f in r["fills"]:
        lines.append(f"| {f['value_bytes']} B | {f['empty_batch_s'] * 1e3:.2f} ms | {f['worst_batch_ms']:.1f} ms "
                     f"| {f['worst_ratio']:.1f}x | {f['p99_ratio']:.1f}x | {100 * f['within_2x']:.0f}% "
                     f"| {f['over_50ms']} | {f['index_evicted']:,.0f} ({f['window_evicted']:,.0f}) |")
    lines += ["", "Batch time by fill level (objects put, in index capacities), against the empty-pool batch: "
              "median / p99 / worst:", "",
              "| values | " + " | ".join(f"{lo:g}-{hi:g}x" for lo, hi in LEVELS) + " |",
              "|---|" + "---|" * len(LEVELS)]
    for f in r["fills"]:
        cells = {(lv["from"], lv["to"]): f"{lv['median']:.1f} / {lv['p99']:.1f} / {lv['worst']:.1f}"
                 for lv in f.get("levels", [])}
        lines.append(f"| {f['value_bytes']} B | " + " | ".join(cells.get(lh, "-") for lh in LEVELS) + " |")
    lines += ["", "Probe lengths (index slots read; share within 1 / 4 / 16 / 64 slots; 64 is the bound):", "",
              "| index load | put's lookup of a new key | insert | a lookup that finds its entry |",
              "|---|---|---|---|"]
    for p in r["probes"]:
        lines.append(f"| {100 * p['load']:.0f}% (filling from empty) | {_dist(p['put_lookup'])} | {_dist(p['insert'])} "
                     f"| {_dist(p['hit'])} |")
    for f in r["fills"]:
        sp = f["steady_probes"]
        lines.append(f"| at the watermark after 3x, {f['value_bytes']} B | {_dist(sp['put_lookup'])} "
                     f"| {_dist(sp['insert'])} | {_dist(f['steady_hit'])} |")
    return "\n".join(lines)
