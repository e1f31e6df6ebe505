"""Puts at a steady pace (part of section "control"): what the ring thread's
spin window buys and what it costs.

One client puts 4 KiB values, one every `pace` µs (busy-waiting between, as a
client computing between its puts; each put is followed by an untimed
remove), against a master with the adaptive spin
window (--ring_max_spin_us, default 500) and one with the fixed 50 µs window
(--ring_max_spin_us=0), alternating, each a fresh master over a fresh pool.
For each: the put's median and p99, and the master's CPU over the timed
puts (% of one core). A put that finds the ring thread asleep pays the
wake-up of its core.
"""
import multiprocessing as mp
import time

from . import common
from .common import MIB

PACES_US = (20, 100, 300, 1000, 10000)
CONFIGS = (("adaptive", []), ("fixed 50 µs", ["--ring_max_spin_us=0"]))


def _client(address, master_pid, paces, seconds, q):
    s = common.connect(address)
    common.settle_placement(s)
    value = b"p" * 4096
    pc = time.perf_counter_ns
    out = {}
    for pace in paces:
        n = max(50, int(seconds * 1e6 / (pace + 5)))
        lat = []
        c0, t0 = common.cpu_seconds(master_pid), time.monotonic()
        next_at = pc()
        for i in range(n):
            next_at += pace * 1000
            while pc() < next_at:
                pass
            t = pc()
            rc = s.put(f"paced/{i}", value)
            lat.append(pc() - t)
            if rc != 0:
                raise RuntimeError(f"paced put failed: {rc}")
            s.remove(f"paced/{i}", force=True)  # keeps the pool below the watermark; untimed
            next_at = max(next_at, pc())  # a slow put does not shorten the next pause
        c1, t1 = common.cpu_seconds(master_pid), time.monotonic()
        out[pace] = {"lat": lat, "master_cpu_percent": 100 * (c1 - c0) / (t1 - t0)}
    s.close()
    q.put(out)


def run(quick=False, pool_dir="/dev/shm"):
    from ..launch import MasterProcess
    ctx = mp.get_context("spawn")
    seconds = 0.2 if quick else 1.0
    samples = {name: {p: {"lat": [], "cpu": []} for p in PACES_US} for name, _ in CONFIGS}
    for _ in range(1 if quick else 2):
        for name, flags in CONFIGS:
            with common.temp_pool("mcxl_bench_paced", pool_dir) as pool, \
                    MasterProcess(pool, 128 * MIB, format=True, extra_flags=flags) as m:
                q = ctx.Queue()
                p = ctx.Process(target=_client, args=(m.address, m.proc.pid, PACES_US, seconds, q))
                p.start()
                for pace, r in q.get(timeout=600).items():
                    samples[name][pace]["lat"] += r["lat"]
                    samples[name][pace]["cpu"].append(r["master_cpu_percent"])
                p.join()
    rows = []
    for pace in PACES_US:
        row = {"pace_us": pace}
        for name, _ in CONFIGS:
            med, p99 = common.percentiles(samples[name][pace]["lat"])
            cpu = samples[name][pace]["cpu"]
            row[name] = {"median_us": med, "p99_us": p99, "master_cpu_percent": sum(cpu) / len(cpu)}
        rows.append(row)
    return {"rows": rows, "seconds_per_pace": seconds}


def markdown(result):
    a, f = (name for name, _ in CONFIGS)
    lines = [f"| a 4 KiB put every | {a}: median µs | p99 µs | master CPU | {f}: median µs | p99 µs | master CPU |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        cells = []
        for name in (a, f):
            c = r[name]
            cells += [f"{c['median_us']:.1f}", f"{c['p99_us']:.1f}", f"{c['master_cpu_percent']:.0f}%"]
        lines.append(f"| {r['pace_us']} µs | " + " | ".join(cells) + " |")
    return "\n".join(lines)
