"""The SSD tier (section "tiering" of python -m mooncake_cxl.bench).

For 64 KiB, 1 MiB and 16 MiB values: get_into latency and bandwidth of an
object in the pool and of one only in the SSD tier (the client reads the
record itself), and the time of a staged read (the master copies the record
back into the pool: a promotion, then the read from the pool). The tier lives
on a disk filesystem (not tmpfs) under --tier-dir (default /var/tmp): its
segments are written and read with O_DIRECT where the filesystem supports it
(disk_tier.h), and before every timed tier read the segment files are also
dropped from the page cache with posix_fadvise(POSIX_FADV_DONTNEED), so a
tier read is a device read. Then demotion while puts continue: sustained
64 KiB puts at the pool's watermark with offload on eviction against the same
puts on a master without a tier (eviction drops), alternating, same run.
Then the same rows for Mooncake 0.3.13 with its SSD offload, in the same run
(tiering_ref.py: its wheel in a child under `unshare -n`; skipped with the
printed reason when the wheel or the namespace is unavailable).
"""
import contextlib
import glob
import os
import shutil
import statistics
import tempfile
import time
import urllib.request

from . import common, pages
from .common import KIB, MIB

SIZES = (64 * KIB, MIB, 16 * MIB)


def _metric(m, name):
    text = urllib.request.urlopen(m.metrics_url + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def _drop_cache(tier_dir):
    for p in glob.glob(os.path.join(tier_dir, "seg-*.mcxl")):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _wait_idle(m, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _metric(m, "mooncake_cxl_tier_queue") != 0:
        time.sleep(0.05)


def _reads(quick, pool_dir, tier_root):
    import numpy as np
    from ..launch import MasterProcess
    rows = []
    pool_bytes = 256 * MIB
    for size in SIZES:
        tier_dir = tempfile.mkdtemp(prefix="mcxl_bench_tier_", dir=tier_root)
        try:
            with common.temp_pool("mcxl_bench_tier", pool_dir) as path, MasterProcess(
                    path, pool_bytes, format=True,
                    extra_flags=["--enable_offload", "--offload_on_evict", f"--root_fs_dir={tier_dir}"]) as m:
                s = common.connect(m.address)
                reps = 5 if quick else (30 if size < 16 * MIB else 10)
                n_disk = reps + 2
                value = os.urandom(size)
                for i in range(n_disk):
                    assert s.put(f"disk/{i}", value) == 0
                # Push them out: fill the pool once over with other objects.
                fill = int(1.2 * pool_bytes // size) + 2
                for i in range(fill):
                    assert s.put(f"fill/{i}", value) == 0
                _wait_idle(m)
                disk = [f"disk/{i}" for i in range(n_disk) if s.get_replica_desc(f"disk/{i}")[0].is_disk_replica()]
                pool = [f"fill/{i}" for i in range(fill - 1, -1, -1)
                        if s.get_replica_desc(f"fill/{i}")[0].is_memory_replica()][:reps]
                buf = np.empty(size, dtype=np.uint8)
                t_pool, t_disk = [], []
                for k in pool:
                    t0 = time.perf_counter()
                    assert s.get_into(k, buf.ctypes.data, size) == size
                    t_pool.append(time.perf_counter() - t0)
                for k in disk[:reps]:
                    _drop_cache(tier_dir)
                    before = s.get_offload_rpc_read_count()
                    t0 = time.perf_counter()
                    assert s.get_into(k, buf.ctypes.data, size) == size
                    t_disk.append(time.perf_counter() - t0)
                    assert s.get_offload_rpc_read_count() == before + 1
                # Staged reads (a client that cannot read the tier): promotion + pool read.
                os.environ["MC_CXL_TIER_DIRECT_READ"] = "0"
                try:
                    st = common.connect(m.address)
                finally:
                    del os.environ["MC_CXL_TIER_DIRECT_READ"]
                t_stage = []
                for k in disk[reps:] + disk[:max(0, 3 - len(disk[reps:]))]:
                    if not st.get_replica_desc(k)[0].is_disk_replica():
                        continue
                    _drop_cache(tier_dir)
                    t0 = time.perf_counter()
                    rc = st.get_into(k, buf.ctypes.data, size)
                    dt = time.perf_counter() - t0
                    if rc != size:
                        print(f"staged read of {k} ({size} bytes) returned {rc}; left out", flush=True)
                        continue
                    t_stage.append(dt)
                st.close()
                page = pages.page_size(os.getpid(), path)  # the page size the pool reads ran on
                s.close()
                med = statistics.median
                rows.append({
                    "size": size, "page": page,
                    "pool_us": med(t_pool) * 1e6, "pool_gbps": size / med(t_pool) / 1e9,
                    "tier_us": med(t_disk) * 1e6, "tier_gbps": size / med(t_disk) / 1e9,
                    "staged_us": med(t_stage) * 1e6 if t_stage else None,
                    "n_pool": len(t_pool), "n_tier": len(t_disk), "n_staged": len(t_stage),
                })
        finally:
            shutil.rmtree(tier_dir, ignore_errors=True)
    return rows


def _put_phase(m, prefix, n, value):
    s = common.connect(m.address)
    writes0 = _metric(m, "mooncake_cxl_tier_writes_total")
    t0 = time.perf_counter()
    for i in range(n):
        assert s.put(f"{prefix}/{i}", value) == 0
    dt = time.perf_counter() - t0
    writes = _metric(m, "mooncake_cxl_tier_writes_total") - writes0
    s.close()
    return n * len(value) / dt, writes * len(value) / dt


def _demotion(quick, pool_dir, tier_root):
    """64 KiB puts writing 2x a 128 MiB pool, on four masters in the same run,
    alternating, median of rounds: no tier (eviction drops), offload on
    eviction, the same with --offload_force_evict, and offload on eviction
    with pre-demotion (--offload_ahead_ratio=0.7: clean copies written in the
    background, eviction only converts). Sustained: back to back, so the
    disk bounds the rate once the pool is full; bursts: 16 MiB of puts, then
    a pause (BURST_PAUSE_S) in which background demotion can catch up; the
    rate counts the time inside bursts only."""
    from ..launch import MasterProcess
    pool_bytes = 128 * MIB
    value = os.urandom(64 * KIB)
    n = int(2 * pool_bytes // len(value))  # every put past the first half evicts
    rounds = 1 if quick else 3
    burst_n, burst_pause = 16 * MIB // len(value), 0.05
    ahead_ratio = 0.7
    keys = ("mooncake_cxl_tier_writes_total", "mooncake_cxl_tier_demotions_total",
            "mooncake_cxl_tier_demotions_clean_total", "mooncake_cxl_tier_ahead_writes_total")

    def counters(m):
        return {k: _metric(m, k) for k in keys}

    def phase(m, prefix, burst):
        """(put bytes/s, tier-write bytes/s over the phase, share of demotions that found a clean copy)."""
        s = common.connect(m.address)
        c0 = counters(m)
        busy = 0.0
        t_start = time.perf_counter()
        for b0 in range(0, n, burst_n if burst else n):
            t0 = time.perf_counter()
            for i in range(b0, min(n, b0 + (burst_n if burst else n))):
                assert s.put(f"{prefix}/{i}", value) == 0
            busy += time.perf_counter() - t0
            if burst:
                time.sleep(burst_pause)
        wall = time.perf_counter() - t_start
        c1 = counters(m)
        s.close()
        d = {k: c1[k] - c0[k] for k in keys}
        dem = d["mooncake_cxl_tier_demotions_total"]
        clean = d["mooncake_cxl_tier_demotions_clean_total"] / dem if dem else None
        return n * len(value) / busy, d["mooncake_cxl_tier_writes_total"] * len(value) / wall, clean

    def settle(m):
        # The tier's queue drained, and (pre-demotion) its copies caught up.
        _wait_idle(m)
        time.sleep(0.5)
        _wait_idle(m)

    res = {name: {"put": [], "demote": [], "clean": [], "burst": [], "burst_demote": [], "burst_clean": []}
           for name in ("without", "offload", "forced", "ahead")}
    tier_dir = tempfile.mkdtemp(prefix="mcxl_bench_tier_", dir=tier_root)
    offload = ["--enable_offload", "--offload_on_evict"]
    try:
        with contextlib.ExitStack() as st:
            masters = {}
            for name, flags in (("offload", offload + [f"--root_fs_dir={tier_dir}/offload"]),
                                ("without", []),
                                ("forced", offload + [f"--root_fs_dir={tier_dir}/forced", "--offload_force_evict",
                                                      "--offloading_queue_limit=64"]),
                                ("ahead", offload + [f"--root_fs_dir={tier_dir}/ahead",
                                                     f"--offload_ahead_ratio={ahead_ratio}"])):
                p = st.enter_context(common.temp_pool(f"mcxl_bench_t_{name}", pool_dir))
                masters[name] = st.enter_context(MasterProcess(p, pool_bytes, format=True, extra_flags=flags))
            for r in range(rounds):
                for burst in (False, True):
                    for name, m in masters.items():
                        gbps, dgbps, clean = phase(m, f"{'b' if burst else 's'}{r}", burst)
                        pre = "burst_" if burst else ""
                        res[name][("burst" if burst else "put")].append(gbps)
                        res[name][pre + "demote"].append(dgbps)
                        if clean is not None:
                            res[name][pre + "clean"].append(clean)
                        if name != "without":
                            settle(m)
            skipped = _metric(masters["forced"], "mooncake_cxl_tier_offload_skipped_total")
            written = _metric(masters["forced"], "mooncake_cxl_tier_writes_total")
    finally:
        shutil.rmtree(tier_dir, ignore_errors=True)

    def med(xs):
        return statistics.median(xs) if xs else None

    def slow(name, key):
        return 1 - med(res[name][key]) / med(res["without"][key])

    out = {"put_with_offload_gbps": med(res["offload"]["put"]) / 1e9,
           "put_without_tier_gbps": med(res["without"]["put"]) / 1e9,
           "demotion_gbps": med(res["offload"]["demote"]) / 1e9, "slowdown": slow("offload", "put"),
           "forced_put_gbps": med(res["forced"]["put"]) / 1e9,
           "forced_demotion_gbps": med(res["forced"]["demote"]) / 1e9,
           "forced_slowdown": slow("forced", "put"),
           "forced_offloaded_share": written / (written + skipped) if written + skipped else None,
           "ahead_ratio": ahead_ratio, "burst_bytes": burst_n * len(value), "burst_pause_s": burst_pause,
           "rounds": rounds}
    for name in ("without", "offload", "forced", "ahead"):
        x = res[name]
        out[name] = {"put_gbps": med(x["put"]) / 1e9, "demotion_gbps": med(x["demote"]) / 1e9,
                     "clean_share": med(x["clean"]), "burst_put_gbps": med(x["burst"]) / 1e9,
                     "burst_demotion_gbps": med(x["burst_demote"]) / 1e9, "burst_clean_share": med(x["burst_clean"]),
                     "slowdown": slow(name, "put"), "burst_slowdown": slow(name, "burst"),
                     "runs": {k: list(v) for k, v in x.items()}}
    return out


def run(quick=False, pool_dir="/dev/shm", tier_root=None):
    tier_root = tier_root or os.environ.get("MC_CXL_BENCH_TIER_DIR", "/var/tmp")
    from . import tiering_ref
    return {"tier_root": tier_root, "reads": _reads(quick, pool_dir, tier_root),
            "demotion": _demotion(quick, pool_dir, tier_root),
            "mooncake": tiering_ref.run(quick, tier_root)}


def markdown(r):
    size = common.size_name
    lines = [f"Tier directory on {r['tier_root']} (O_DIRECT where supported; segment files dropped from the "
             "page cache with posix_fadvise before every tier read).", "",
             "| value | pool page | pool get_into µs | GB/s | tier get_into µs | GB/s | staged read (promotion + read) µs |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for x in r["reads"]:
        st = f"{x['staged_us']:.0f}" if x["staged_us"] is not None else "n/a"
        lines.append(f"| {size(x['size'])} | {x.get('page', '?')} | {x['pool_us']:.0f} | {x['pool_gbps']:.2f} | {x['tier_us']:.0f} | "
                     f"{x['tier_gbps']:.2f} | {st} |")
    d = r["demotion"]
    share = "n/a" if d["forced_offloaded_share"] is None else f"{100 * d['forced_offloaded_share']:.0f}%"
    lines += ["", "| 64 KiB puts at the watermark | GB/s |", "|---|---:|",
              f"| no tier (eviction drops) | {d['put_without_tier_gbps']:.2f} |",
              f"| offload on eviction (demotion running) | {d['put_with_offload_gbps']:.2f} |",
              f"| demotion throughput meanwhile | {d['demotion_gbps']:.2f} |",
              f"| put slowdown while offload runs | {d['slowdown'] * 100:.0f}% |",
              f"| with --offload_force_evict --offloading_queue_limit=64 | {d['forced_put_gbps']:.2f} |",
              f"| its demotion throughput meanwhile | {d['forced_demotion_gbps']:.2f} |",
              f"| its put slowdown | {d['forced_slowdown'] * 100:.0f}% |",
              f"| its evicted objects that reached the tier | {share} |",
              ]
    if "ahead" in d:
        a, o, w = d["ahead"], d["offload"], d["without"]

        def pct(x):
            return "n/a" if x is None else f"{100 * x:.0f}%"
        lines += ["", f"Pre-demotion (`--offload_ahead_ratio={d['ahead_ratio']}`): clean copies of the coldest "
                  "objects written in the background, eviction only converts. Sustained = 2x the pool back to "
                  f"back; bursts = {d['burst_bytes'] // MIB} MiB of puts then {d['burst_pause_s'] * 1000:.0f} ms "
                  f"idle (rate over the time inside bursts); median of {d['rounds']} alternating rounds.", "",
                  "| 64 KiB puts, 2x the pool | sustained GB/s | slowdown | demotion GB/s | evictions already clean "
                  "| burst GB/s | burst slowdown | burst demotion GB/s | burst evictions already clean |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for label, x in (("no tier", w), ("offload on eviction", o), ("--offload_force_evict", d["forced"]),
                         ("offload on eviction + pre-demotion", a)):
            lines.append(f"| {label} | {x['put_gbps']:.2f} | {pct(x['slowdown'])} | {x['demotion_gbps']:.2f} | "
                         f"{pct(x['clean_share'])} | {x['burst_put_gbps']:.2f} | {pct(x['burst_slowdown'])} | "
                         f"{x['burst_demotion_gbps']:.2f} | {pct(x['burst_clean_share'])} |")
    lines.append("")
    from . import tiering_ref
    lines.append(tiering_ref.markdown(r["mooncake"]) if "mooncake" in r else "Mooncake 0.3.13 rows: not run.")
    return "\n".join(lines)
