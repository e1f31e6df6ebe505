"""The control path (section "control" of python -m mooncake_cxl.bench):
CXL RPC rings against TCP.

The cheapest master request (remove of a missing key), a ping (health_check)
and a 4 KiB put, timed in a client process over rings and in another over
TCP (each after 0.3 s of untimed pings: a long-lived client's figures),
alternating rounds so machine drift hits both; then the CPU time the master
burns while idle with 8 clients attached; then puts at a steady pace (paced.py).
"""
import multiprocessing as mp
import os
import time

from . import coherence as coh
from . import common, paced
from .common import MIB

ROUNDS = 3
WARMUP_S = 0.3


def _client(address, transport, n, q):
    os.environ["MC_CXL_RPC"] = transport
    s = common.connect(address)
    value = b"v" * 4096
    common.settle_placement(s, WARMUP_S)  # the rows are a long-lived client's
    out = {"remove_missing": [], "ping": [], "put_4k": []}
    for i in range(n):
        t0 = time.perf_counter_ns()
        s.remove(f"missing/{i}")
        out["remove_missing"].append(time.perf_counter_ns() - t0)
    for i in range(n):
        t0 = time.perf_counter_ns()
        s.health_check()
        out["ping"].append(time.perf_counter_ns() - t0)
    for i in range(n):
        key = f"ctl/{transport}/{os.getpid()}/{i}"
        t0 = time.perf_counter_ns()
        rc = s.put(key, value)
        out["put_4k"].append(time.perf_counter_ns() - t0)
        assert rc == 0
    s.remove_all(force=True)
    s.close()
    q.put(out)


def _idle_client(address, ready, stop):
    s = common.connect(address)
    ready.put(1)
    stop.wait(120)
    s.close()


def run(quick=False, pool_dir="/dev/shm", coherence="coherent"):
    """Both transports against one master of its own, over a fresh pool."""
    from ..launch import MasterProcess
    with coh.build_env(coherence, 0), common.temp_pool("mcxl_bench_ctl", pool_dir) as pool, \
            MasterProcess(pool, 256 * MIB, format=True, extra_flags=coh.master_flags(coherence)) as m:
        result = measure(m, quick=quick)
    result["paced"] = paced.run(quick=quick, pool_dir=pool_dir)
    result["coherence"] = coherence
    return result


def measure(master, quick=False):
    ctx = mp.get_context("spawn")
    n = 300 if quick else 3000
    samples = {t: {"remove_missing": [], "ping": [], "put_4k": []} for t in ("ring", "tcp")}
    for _ in range(1 if quick else ROUNDS):
        for transport in ("ring", "tcp"):
            q = ctx.Queue()
            p = ctx.Process(target=_client, args=(master.address, transport, n, q))
            p.start()
            for k, v in q.get(timeout=600).items():
                samples[transport][k] += v
            p.join()
    rows = []
    for op in ("remove_missing", "ping", "put_4k"):
        ring_med, ring_p99 = common.percentiles(samples["ring"][op])
        tcp_med, tcp_p99 = common.percentiles(samples["tcp"][op])
        rows.append({"op": op, "ring_median_us": ring_med, "ring_p99_us": ring_p99,
                     "tcp_median_us": tcp_med, "tcp_p99_us": tcp_p99,
                     "reduction": 1 - ring_med / tcp_med})
    # Idle: 8 attached clients, nobody calling.
    ready, stop = ctx.Queue(), ctx.Event()
    idlers = [ctx.Process(target=_idle_client, args=(master.address, ready, stop)) for _ in range(8)]
    for p in idlers:
        p.start()
    for _ in idlers:
        ready.get(timeout=120)
    time.sleep(0.5)
    window = 2.0 if quick else 5.0
    c0, t0 = common.cpu_seconds(master.proc.pid), time.monotonic()
    time.sleep(window)
    c1, t1 = common.cpu_seconds(master.proc.pid), time.monotonic()
    stop.set()
    for p in idlers:
        p.join(60)
    return {"rows": rows, "idle_clients": 8, "idle_cpu_percent": 100 * (c1 - c0) / (t1 - t0),
            "idle_window_s": t1 - t0}


def markdown(result):
    lines = ["| master request | rings median µs | rings p99 µs | TCP median µs | TCP p99 µs | median reduction |",
             "|---|---:|---:|---:|---:|---:|"]
    names = {"remove_missing": "remove of a missing key", "ping": "ping (health_check)", "put_4k": "put 4 KiB"}
    for r in result["rows"]:
        lines.append(f"| {names[r['op']]} | {r['ring_median_us']:.1f} | {r['ring_p99_us']:.1f} | "
                     f"{r['tcp_median_us']:.1f} | {r['tcp_p99_us']:.1f} | {r['reduction'] * 100:.0f}% |")
    lines.append("")
    if result.get("coherence", "coherent") != "coherent":
        lines.append(f"Pool mode: {result['coherence']} (--coherence {result['coherence']}).")
        lines.append("")
    lines.append(f"Master CPU while idle with {result['idle_clients']} clients attached: "
                 f"{result['idle_cpu_percent']:.2f}% of one core (over {result['idle_window_s']:.1f} s).")
    if "paced" in result:
        lines += ["", "Puts at a steady pace, the ring thread's adaptive spin window against a fixed 50 µs "
                  "one (a fresh master each, alternating; master CPU over the timed puts):", "",
                  paced.markdown(result["paced"])]
    return "\n".join(lines)
