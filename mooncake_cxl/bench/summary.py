"""The headline figures (the goals of the data and control paths and of
eviction), each beside the baseline measured in the same run (the machine
drifts between runs: compare within a run, not across).

Depends on the result dicts of data, cold, control and eviction; prints the rows
whose sections ran.
"""
from . import common
from .common import KIB


def _row(rows, op, size):
    return next((r for r in rows if r["op"] == op and r["size"] == size), None)


def markdown(results):
    lines = ["| figure | this run | same-run baseline | goal |", "|---|---:|---|---|"]
    data, control, evict = results.get("data"), results.get("control"), results.get("eviction")
    if data:
        rows = data["rows"]
        put = _row(rows, "put", 4 * KIB)
        ping = next((r for r in (control or {}).get("rows", []) if r["op"] == "ping"), None)
        if put:
            floor = f"4 KiB memcpy {put['memcpy_median_us']:.2f} µs"
            if ping:
                floor = f"ring ping {ping['ring_median_us']:.2f} µs + " + floor
            lines.append(f"| put 4 KiB median (rings), put/remove cycles | {put['median_us']:.2f} µs | {floor} | ≤ 2 µs |")
        new = _row(rows, "put (new keys)", 4 * KIB)
        if new:
            lines.append(f"| put 4 KiB of new keys, no removes: median / p99 ({new['samples']} puts) | "
                         f"{new['median_us']:.2f} / {new['p99_us']:.2f} µs | put/remove cycles "
                         f"{put['median_us']:.2f} / {put['p99_us']:.2f} µs | ≤ 2 / ≤ 6 µs |")
        get = _row(rows, "get", 4 * KIB)
        if get:
            lines.append(f"| get 4 KiB median | {get['median_us']:.2f} µs | 4 KiB memcpy "
                         f"{get['memcpy_median_us']:.2f} µs (pool page {get.get('page', '?')}) | ≤ 0.5 µs |")
        placed = data.get("put_4k_separate_cores")
        if placed:
            lines.append(f"| put 4 KiB median, writer on CPU {placed['writer_cpu']} and every master thread on "
                         f"CPU {placed['master_cpu']} (pinned) | {placed['median_us']:.2f} µs | the unpinned row "
                         f"above: {put['median_us']:.2f} µs | ≤ 2 µs |")
        b = _row(rows, "batch_get_into 32x64 KiB vs anonymous memcpy", 32 * 64 * KIB)
        if b:
            lines.append(f"| batch_get_into 32 × 64 KiB ÷ one anonymous 2 MiB memcpy (median of per-call ratios), "
                         f"pool page {b.get('page', '?')} | "
                         f"{b['vs_memcpy']:.2f}× | memcpy {b['memcpy_median_us']:.1f} µs, store "
                         f"{b['median_us']:.1f} µs | ≥ 0.9× |")
        # The goal holds at every size: every put row with its memcpy tail.
        for r in sorted((r for r in rows if r["op"] == "put" and r.get("memcpy_p99_us")), key=lambda r: r["size"]):
            label = common.size_name(r["size"])
            lines.append(f"| put {label} p99 ÷ median ({r['samples']} puts) | {r['p99_over_median']:.1f}× | "
                         f"plain memcpy of the same size: {r['memcpy_p99_us'] / r['memcpy_median_us']:.1f}× | ≤ 3× |")
        big = _row(rows, "put (new keys)", 16 * KIB * KIB)
        if big:
            lines.append(f"| put 16 MiB of new keys p99 ÷ median ({big['samples']} puts) | "
                         f"{big['p99_over_median']:.1f}× | plain memcpy of the same size: "
                         f"{big['memcpy_p99_us'] / big['memcpy_median_us']:.1f}× | ≤ 2× |")
    cold = results.get("cold")
    if cold:
        for size, n in cold["plan"]:
            on = [sum(lat) / len(lat) / 1e3 for lat in cold["first"][True][size]]
            off = [sum(lat) / len(lat) / 1e3 for lat in cold["first"][False][size]]
            lines.append(f"| first {n} puts of {common.size_name(size)} into a fresh pool, mean (default: "
                         f"prefault on) | {sum(on) / len(on):.2f} µs | prefault off: {sum(off) / len(off):.2f} µs | "
                         f"— |")
    if evict:
        lines.append(f"| 64 KiB put throughput lost while eviction runs | {evict['eviction_cost'] * 100:.0f}% | "
                     f"pool half empty {evict['put_64k_half_empty_gbps']:.2f} GB/s vs at the watermark "
                     f"{evict['put_64k_at_watermark_gbps']:.2f} GB/s (medians), median of "
                     f"{evict.get('eviction_rounds', 1)} alternating pairs | ≤ 10% |")
    return "\n".join(lines) if len(lines) > 2 else ""
