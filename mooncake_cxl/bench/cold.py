"""A fresh pool as a new user meets it (section "cold" of python -m
mooncake_cxl.bench): a master started with its defaults on a new pool in
/dev/shm, a client that sets up and puts at once, keys new each time.

Two parts, each alternating the default configuration (prefault on: the
master and the client populate the pool's pages in the background) with
prefault off (--prefault_pool=false, MC_CXL_PREFAULT=0) in the same run:

* first puts: the first 2,000 puts of 4 KiB, then the first 20 of 16 MiB,
  into a fresh 256 MiB pool, timed from the moment setup returns (the
  background population races them, as it would for a user);
* windows: 10,000 puts of 4 KiB of new keys into a fresh 256 MiB pool, the
  median of each window of 2,000 (the population finishing under the puts);
* start-up: master start (process start to its ready line), client setup
  (the setup call) and how long the master's background population took,
  for a 1 GiB and a 16 GiB pool (a sparse file; the 16 GiB one only when
  /dev/shm has the room, stopped right after the client's setup and deleted).
"""
import multiprocessing as mp
import os
import re
import statistics
import time

from . import common
from .common import KIB, MIB

GIB = 1 << 30
ROUNDS = 2
FIRST_PUTS = ((4 * KIB, 2000), (16 * MIB, 20))
WINDOWS = (4 * KIB, 2000, 5)  # value size, puts per window, windows
START_SIZES = (1 * GIB, 16 * GIB)
_POPULATED = re.compile(r"\[master\] populated the pool .* in ([\d.]+) s")


def _flags(prefault):
    return [] if prefault else ["--prefault_pool=false"]


def _first_puts(address, prefault, plan, out):
    os.environ["MC_CXL_PREFAULT"] = "1" if prefault else "0"
    t0 = time.perf_counter()
    s = common.connect(address)
    setup_s = time.perf_counter() - t0
    rows = {"setup_s": setup_s}
    for size, n in plan:
        value = common.value(size, 0)
        lat = []
        for i in range(n):
            t0 = time.perf_counter_ns()
            rc = s.put(f"cold/{size}/{i}", value)
            lat.append(time.perf_counter_ns() - t0)
            if rc != 0:
                raise RuntimeError(f"put {i} of {size} B failed: {rc}")
        rows[size] = lat
    s.close()
    out.put(rows)


def _setup_only(address, prefault, out):
    os.environ["MC_CXL_PREFAULT"] = "1" if prefault else "0"
    t0 = time.perf_counter()
    s = common.connect(address)
    out.put(time.perf_counter() - t0)
    s.close()


def _in_child(ctx, target, *args):
    q = ctx.Queue()
    p = ctx.Process(target=target, args=args + (q,))
    p.start()
    result = q.get(timeout=600)
    p.join()
    return result


def _room(pool_dir, size):
    st = os.statvfs(pool_dir)
    return st.f_bavail * st.f_frsize > size + 2 * GIB


def run(quick=False, pool_dir="/dev/shm"):
    from ..launch import MasterProcess
    ctx = mp.get_context("spawn")
    plan = tuple((size, max(5, n // 10)) for size, n in FIRST_PUTS) if quick else FIRST_PUTS
    wsize, wlen, wcount = (WINDOWS[0], max(20, WINDOWS[1] // 20), WINDOWS[2]) if quick else WINDOWS
    first = {True: {}, False: {}}
    windows = {True: [], False: []}
    for r in range(1 if quick else ROUNDS):
        for prefault in ((True, False) if r % 2 == 0 else (False, True)):
            with common.temp_pool("mcxl_bench_cold", pool_dir) as pool, \
                    MasterProcess(pool, 256 * MIB, format=True, extra_flags=_flags(prefault)) as m:
                rows = _in_child(ctx, _first_puts, m.address, prefault, plan)
            first[prefault].setdefault("setup_s", []).append(rows.pop("setup_s"))
            for size, lat in rows.items():
                first[prefault].setdefault(size, []).append(lat)
        for prefault in ((True, False) if r % 2 == 0 else (False, True)):
            with common.temp_pool("mcxl_bench_cold", pool_dir) as pool, \
                    MasterProcess(pool, 256 * MIB, format=True, extra_flags=_flags(prefault)) as m:
                lat = _in_child(ctx, _first_puts, m.address, prefault, ((wsize, wlen * wcount),))[wsize]
            windows[prefault].append([common.percentiles(lat[i * wlen:(i + 1) * wlen])[0] for i in range(wcount)])
    start = []
    sizes = (START_SIZES[0],) if quick else START_SIZES
    for size in sizes:
        if not _room(pool_dir, size):
            start.append({"pool_bytes": size, "skipped": f"{pool_dir} has no room for {size // GIB} GiB"})
            continue
        for prefault in (True, False):
            with common.temp_pool("mcxl_bench_start", pool_dir) as pool:
                t0 = time.perf_counter()
                with MasterProcess(pool, size, format=True, extra_flags=_flags(prefault)) as m:
                    master_s = time.perf_counter() - t0
                    setup_s = _in_child(ctx, _setup_only, m.address, prefault)
                    populated = None
                    if prefault and size <= START_SIZES[0]:  # the large one is stopped at once
                        deadline = time.monotonic() + 120
                        while populated is None and time.monotonic() < deadline:
                            hit = _POPULATED.search(m.log_tail(1 << 20))
                            populated = float(hit.group(1)) if hit else None
                            time.sleep(0.05)  # polling the master's log for its one line
            start.append({"pool_bytes": size, "prefault": prefault, "master_start_s": master_s,
                          "client_setup_s": setup_s, "populated_s": populated})
    return {"machine": common.machine(), "quick": quick, "first": first, "start": start, "plan": plan,
            "windows": windows, "window_plan": (wsize, wlen, wcount)}


def _summary(lats):
    """(median of per-round medians, median of per-round p99s, per-round means):
    a round is one fresh pool."""
    meds = [common.percentiles(lat)[0] for lat in lats]
    p99s = [common.percentiles(lat)[1] for lat in lats]
    means = [sum(lat) / len(lat) / 1e3 for lat in lats]
    return statistics.median(meds), statistics.median(p99s), means


def markdown(result):
    lines = ["First puts into a fresh 256 MiB pool right after setup (new keys, no removes), "
             "each round a new pool, the configurations alternating in one run:", "",
             "| puts | prefault on (default): median µs | p99 µs | mean µs per round | prefault off: median µs | "
             "p99 µs | mean µs per round | on ÷ off (mean) |", "|---|---:|---:|---|---:|---:|---|---:|"]
    for size, n in result["plan"]:
        on_med, on_p99, on_means = _summary(result["first"][True][size])
        off_med, off_p99, off_means = _summary(result["first"][False][size])
        ratio = (sum(on_means) / len(on_means)) / (sum(off_means) / len(off_means))
        lines.append(f"| first {n} × {common.size_name(size)} | {on_med:.2f} | {on_p99:.2f} | "
                     f"{' / '.join(f'{x:.2f}' for x in on_means)} | {off_med:.2f} | {off_p99:.2f} | "
                     f"{' / '.join(f'{x:.2f}' for x in off_means)} | {ratio:.2f}× |")
    if result.get("windows"):
        wsize, wlen, wcount = result["window_plan"]
        lines += ["", f"Put {common.size_name(wsize)} median, {wlen * wcount:,} new keys on a fresh 256 MiB pool "
                  f"({wcount} windows of {wlen:,}; one value per round, rounds alternating):", "",
                  "| window | prefault on (default): median µs per round | prefault off: median µs per round | "
                  "on ÷ off |", "|---|---|---|---:|"]
        for i in range(wcount):
            on = [w[i] for w in result["windows"][True]]
            off = [w[i] for w in result["windows"][False]]
            lines.append(f"| {i + 1} | {' / '.join(f'{x:.2f}' for x in on)} | {' / '.join(f'{x:.2f}' for x in off)} "
                         f"| {statistics.median(on) / statistics.median(off):.2f}× |")
    lines += ["", "Start-up (master: process start to its ready line; client: the setup call):", "",
              "| pool | prefault | master start ms | client setup ms | background population s |",
              "|---|---|---:|---:|---:|"]
    for row in result["start"]:
        size = f"{row['pool_bytes'] // GIB} GiB"
        if "skipped" in row:
            lines.append(f"| {size} | — | skipped: {row['skipped']} | | |")
            continue
        pop = row["populated_s"]
        pop = f"{pop:.2f}" if pop is not None else ("stopped before done" if row["prefault"] else "—")
        lines.append(f"| {size} | {'on (default)' if row['prefault'] else 'off'} | "
                     f"{row['master_start_s'] * 1e3:.0f} | {row['client_setup_s'] * 1e3:.0f} | {pop} |")
    return "\n".join(lines)
