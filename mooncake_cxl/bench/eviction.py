"""Eviction and master memory (section "eviction" of python -m mooncake_cxl.bench).

Sustained put throughput of 64 KiB objects while the pool sits at its high
watermark (every few puts run an eviction round) against the same puts into
a half-empty pool, alternating, same run. Then the master's own memory per
stored object with one million objects (its anonymous RSS: the pool's pages
are the CXL device's, not the master's).
"""
import multiprocessing as mp
import os
import statistics
import time

from . import common
from .common import KIB, MIB


def _throughput(address, pool_bytes, n, rounds, q, prefault=True):
    os.environ["MC_CXL_PREFAULT"] = "1" if prefault else "0"  # on (the default): no first-touch faults
    s = common.connect(address)
    value = b"e" * (64 * KIB)
    per_fill = int(pool_bytes * 0.25 // len(value))
    out = {"half_empty": [], "at_watermark": []}
    for r in range(rounds):
        for phase in ("half_empty", "at_watermark"):
            s.remove_all(force=True)
            # Half empty: start at 25 %, end below 50 %. At the watermark:
            # fill past it first, so every put of the timed batch evicts.
            fill = per_fill if phase == "half_empty" else 4 * per_fill
            for i in range(fill):
                assert s.put(f"fill/{r}/{phase}/{i}", value) == 0
            t0 = time.perf_counter()
            for i in range(n):
                assert s.put(f"timed/{r}/{phase}/{i}", value) == 0
            out[phase].append(n * len(value) / (time.perf_counter() - t0))
    s.close()
    q.put(out)


def _bulk(address, count, batch, q):
    s = common.connect(address)
    value = b"m" * 64
    for b in range(0, count, batch):
        keys = [f"obj{i:07d}" for i in range(b, min(count, b + batch))]
        assert s.put_batch(keys, [value] * len(keys)) == 0
    q.put(1)
    s.close()


def _rss(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("RssAnon", "RssShmem", "VmRSS")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
    return out


def run(quick=False, pool_dir="/dev/shm", prefault=True):
    from ..launch import MasterProcess
    ctx = mp.get_context("spawn")
    result = {}
    pool_bytes = 256 * MIB
    with common.temp_pool("mcxl_bench_evict", pool_dir) as path, MasterProcess(path, pool_bytes, format=True,
                                                                             extra_flags=[] if prefault else ["--prefault_pool=false"]) as m:
        q = ctx.Queue()
        # Each timed batch is short (1000 x 64 KiB, ~10 ms), so one scheduler tick moves
        # it by 10-70%: many alternating rounds, and the loss is the median of the
        # per-round ratios (each pair ran back to back).
        p = ctx.Process(target=_throughput, args=(m.address, pool_bytes, 200 if quick else 1000,
                                                  1 if quick else 21, q, prefault))
        p.start()
        t = q.get(timeout=900)
        p.join()
        half, wm = statistics.median(t["half_empty"]), statistics.median(t["at_watermark"])
        result["put_64k_half_empty_gbps"] = half / 1e9
        result["put_64k_at_watermark_gbps"] = wm / 1e9
        losses = sorted(1 - w / h for h, w in zip(t["half_empty"], t["at_watermark"]))
        result["eviction_cost"] = statistics.median(losses)
        result["eviction_cost_quartiles"] = [losses[len(losses) // 4], losses[(3 * len(losses)) // 4]]
        result["eviction_rounds"] = len(losses)
        result["evict_log"] = [l for l in m.log_tail(4000).splitlines() if "[evict]" in l][-1:]
    count = 100_000 if quick else 1_000_000
    with common.temp_pool("mcxl_bench_mem", pool_dir) as path, \
            MasterProcess(path, 1 << 30, format=True, extra_flags=[f"--index_capacity={2 * count}"]) as m:
        before = _rss(m.proc.pid)
        q = ctx.Queue()
        p = ctx.Process(target=_bulk, args=(m.address, count, 1000, q))
        p.start()
        q.get(timeout=900)
        p.join()
        after = _rss(m.proc.pid)
        result["objects"] = count
        result["master_anon_bytes_per_object"] = after["RssAnon"] / count
        result["master_anon_growth_per_object"] = (after["RssAnon"] - before["RssAnon"]) / count
        result["pool_pages_touched_by_master_per_object"] = after.get("RssShmem", 0) / count
    return result


def _quartiles(r):
    q = r.get("eviction_cost_quartiles")
    return f"{q[0] * 100:.0f}% / {q[1] * 100:.0f}%" if q else "-"


def markdown(r):
    return "\n".join([
        "| 64 KiB puts, sustained | GB/s |", "|---|---:|",
        f"| pool half empty | {r['put_64k_half_empty_gbps']:.2f} |",
        f"| pool at the high watermark (eviction running) | {r['put_64k_at_watermark_gbps']:.2f} |",
        f"| throughput lost to eviction (median of {r.get('eviction_rounds', 1)} alternating pairs; "
        f"quartiles {_quartiles(r)}) | {r['eviction_cost'] * 100:.0f}% |",
        "",
        f"Master memory with {r['objects']:,} objects: {r['master_anon_bytes_per_object']:.0f} bytes/object "
        f"of its own (anonymous) memory, {r['master_anon_growth_per_object']:.0f} of them added by the "
        f"objects; the index entries and headers it writes live in the pool "
        f"({r['pool_pages_touched_by_master_per_object']:.0f} bytes/object of pool pages mapped).",
    ])
