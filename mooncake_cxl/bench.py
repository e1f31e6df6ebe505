"""Benchmark: python -m mooncake_cxl.bench [--quick] [--json FILE]

Starts a master over a pool in /dev/shm, then a writer process that puts
values of 4 KiB, 64 KiB, 1 MiB and 16 MiB, then a reader process (another
process, as on a decode node) that gets them and probes them with is_exist.
Every latency is printed beside a plain memcpy of the same size measured in
the reader process in the same run, so the ratio is meaningful on a noisy
machine. Latencies are per call through the Python API, median and p99.
"""
import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import tempfile
import time
import uuid

KIB, MIB = 1 << 10, 1 << 20

# size, keys kept for the reader, timed puts, timed gets / is_exist
PLAN = [
    (4 * KIB, 2048, 4000, 20000),
    (64 * KIB, 256, 2000, 5000),
    (1 * MIB, 32, 300, 1000),
    (4 * MIB, 16, 100, 400),
    (16 * MIB, 8, 40, 100),
]
BATCH = 32  # batch_get_into row: BATCH values of 64 KiB per call


def _value(size, i):
    head = f"{size}:{i}:".encode()
    return head + bytes([i % 251]) * (size - len(head))


def _key(size, i):
    return f"bench/{size}/{i}"


def _store(address):
    from mooncake_cxl import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address)
    if rc != 0:
        raise RuntimeError(f"setup failed: {rc}")
    return s


def _percentiles(ns):
    ns = sorted(ns)
    return statistics.median(ns) / 1e3, ns[min(len(ns) - 1, int(len(ns) * 0.99))] / 1e3


def writer(address, plan, out):
    s = _store(address)
    results = {}
    for size, nkeys, nputs, _ in plan:
        for i in range(nkeys):
            if s.put(_key(size, i), _value(size, i)) != 0:
                raise RuntimeError(f"put of {size} B failed")
        value = _value(size, 0)
        lat = []
        for i in range(nputs):
            key = f"bench/tmp/{size}/{i}"
            t0 = time.perf_counter_ns()
            rc = s.put(key, value)
            lat.append(time.perf_counter_ns() - t0)
            if rc != 0:
                raise RuntimeError(f"timed put of {size} B failed: {rc}")
            s.remove(key, force=True)
        results[size] = lat
    s.close()
    out.put(("put", results))


def reader(address, plan, out):
    from mooncake_cxl import _core
    s = _store(address)
    import numpy as np
    results = {"get": {}, "is_exist": {}, "memcpy": {}, "get_into": {}, "get_buffer": {}, "batch_get_into": {}}
    for size, nkeys, _, ngets in plan:
        for i in range(nkeys):  # check the data once, and warm the mapping
            if s.get(_key(size, i)) != _value(size, i):
                raise RuntimeError(f"wrong bytes for {_key(size, i)}")
        keys = [_key(size, i) for i in range(nkeys)]
        lat = []
        for i in range(ngets):
            k = keys[i % nkeys]
            t0 = time.perf_counter_ns()
            v = s.get(k)
            lat.append(time.perf_counter_ns() - t0)
            if len(v) != size:
                raise RuntimeError("short read")
            del v
        results["get"][size] = lat
        lat = []
        for i in range(ngets):
            k = keys[i % nkeys]
            t0 = time.perf_counter_ns()
            r = s.is_exist(k)
            lat.append(time.perf_counter_ns() - t0)
            if r != 1:
                raise RuntimeError("is_exist missed")
        results["is_exist"][size] = lat
        results["memcpy"][size] = _core._bench_memcpy(size, size * nkeys, ngets)
        dst = np.zeros(size, dtype=np.uint8)
        s.register_buffer(dst.ctypes.data, dst.nbytes)
        lat = []
        for i in range(ngets):
            t0 = time.perf_counter_ns()
            r = s.get_into(keys[i % nkeys], dst.ctypes.data, size)
            lat.append(time.perf_counter_ns() - t0)
            if r != size:
                raise RuntimeError(f"get_into returned {r}")
        results["get_into"][size] = lat
        s.unregister_buffer(dst.ctypes.data)
        lat = []
        for i in range(ngets):
            t0 = time.perf_counter_ns()
            h = s.get_buffer(keys[i % nkeys])
            lat.append(time.perf_counter_ns() - t0)
            if h is None or len(h) != size:
                raise RuntimeError("get_buffer missed")
            del h
        results["get_buffer"][size] = lat
        if size == 64 * KIB and nkeys >= BATCH:
            bufs = np.zeros((BATCH, size), dtype=np.uint8)
            s.register_buffer(bufs.ctypes.data, bufs.nbytes)
            ptrs = [bufs.ctypes.data + j * size for j in range(BATCH)]
            sizes = [size] * BATCH
            lat = []
            for i in range(max(20, ngets // BATCH)):
                batch = [keys[(i * BATCH + j) % nkeys] for j in range(BATCH)]
                t0 = time.perf_counter_ns()
                r = s.batch_get_into(batch, ptrs, sizes)
                lat.append(time.perf_counter_ns() - t0)
                if r != sizes:
                    raise RuntimeError(f"batch_get_into returned {r}")
            results["batch_get_into"][size * BATCH] = lat
            # Baseline: BATCH plain memcpys of 64 KiB into BATCH distinct buffers.
            per = _core._bench_memcpy(size, size * nkeys, ngets, size * BATCH)
            results["memcpy"][size * BATCH] = [BATCH * x for x in per]
    s.close()
    out.put(("read", results))


def machine():
    model = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}"


def _size_name(size):
    return f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"


def run(quick=False, pool_dir="/dev/shm"):
    from .launch import MasterProcess
    plan = [(s, max(2, k // 4), max(10, p // 10), max(20, g // 10)) for s, k, p, g in PLAN] if quick else PLAN
    pool_bytes = sum(size * (nkeys + 2) for size, nkeys, _, _ in plan) * 2 + 64 * MIB
    pool = os.path.join(pool_dir if os.path.isdir(pool_dir) else tempfile.gettempdir(),
                        f"mcxl_bench_{uuid.uuid4().hex}")
    ctx = mp.get_context("spawn")
    try:
        with MasterProcess(pool, pool_bytes, format=True) as m:
            q = ctx.Queue()
            rows = {}
            for target in (writer, reader):
                p = ctx.Process(target=target, args=(m.address, plan, q))
                p.start()
                kind, data = q.get(timeout=600)
                p.join()
                rows[kind] = data
    finally:
        if os.path.exists(pool):
            os.unlink(pool)
    table = []
    read = rows["read"]
    for size in [p[0] for p in plan] + sorted(read["batch_get_into"]):
        mc_med, mc_p99 = _percentiles(read["memcpy"][size])
        ops = [("put", rows["put"].get(size)), ("get", read["get"].get(size)),
               ("get_into", read["get_into"].get(size)), ("get_buffer", read["get_buffer"].get(size)),
               ("is_exist", read["is_exist"].get(size)),
               (f"batch_get_into {BATCH}x{_size_name(size // BATCH)}", read["batch_get_into"].get(size))]
        for op, lat in ops:
            if lat is None:
                continue
            med, p99 = _percentiles(lat)
            table.append({
                "op": op, "size": size, "median_us": med, "p99_us": p99,
                "gbps": size / (med * 1e3), "memcpy_median_us": mc_med,
                "memcpy_gbps": size / (mc_med * 1e3), "vs_memcpy": mc_med / med, "samples": len(lat),
            })
    return {"machine": machine(), "quick": quick, "rows": table}


def markdown(result):
    lines = [f"Machine: {result['machine']}", "",
             "Latency per call through the Python API; writer and reader are separate processes; "
             "memcpy is a plain single-thread memcpy of the same size in the reader, same run.", "",
             "| op | size | median µs | p99 µs | GB/s (median) | memcpy median µs | memcpy GB/s | store ÷ memcpy bandwidth |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        moves_data = r["op"] not in ("is_exist", "get_buffer")  # they copy nothing
        gbps = f"{r['gbps']:.2f}" if moves_data else "—"
        ratio = f"{r['vs_memcpy'] * 100:.0f}%" if moves_data else "—"
        lines.append(f"| {r['op']} | {_size_name(r['size'])} | {r['median_us']:.2f} | {r['p99_us']:.2f} | "
                     f"{gbps} | {r['memcpy_median_us']:.2f} | {r['memcpy_gbps']:.2f} | {ratio} |")
    return "\n".join(lines)


SECTIONS = ("data", "control", "eviction")


def run_control(quick=False, pool_dir="/dev/shm"):
    from . import bench_control
    from .launch import MasterProcess
    pool = os.path.join(pool_dir if os.path.isdir(pool_dir) else tempfile.gettempdir(),
                        f"mcxl_bench_ctl_{uuid.uuid4().hex}")
    try:
        with MasterProcess(pool, 256 * MIB, format=True) as m:
            return bench_control.run(m, quick=quick)
    finally:
        if os.path.exists(pool):
            os.unlink(pool)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mooncake_cxl.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few iterations: a smoke run, not a measurement")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help="comma-separated sections: data (put/get/zero-copy), control (rings vs TCP), "
                         "eviction (throughput at the watermark, master memory per object)")
    ap.add_argument("--compare", choices=["mooncake"],
                    help="run the same workloads on Mooncake's own store too (needs the oracle extra)")
    ap.add_argument("--out", default="bench_out", help="with --compare: where compare.{md,json,png} go")
    args = ap.parse_args(argv)
    if args.compare:
        from .bench_compare import main as compare_main
        raise SystemExit(compare_main(["--out", args.out] + (["--quick"] if args.quick else [])))
    sections = [x for x in args.only.split(",") if x]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    pool_dir = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    results = {}
    if "data" in sections:
        results["data"] = run(quick=args.quick, pool_dir=pool_dir)
        print("## Data path\n\n" + markdown(results["data"]) + "\n", flush=True)
    if "control" in sections:
        from . import bench_control
        results["control"] = run_control(quick=args.quick, pool_dir=pool_dir)
        print("## Control path: CXL RPC rings vs TCP\n\n" + bench_control.markdown(results["control"]) + "\n",
              flush=True)
    if "eviction" in sections:
        from . import bench_eviction
        results["eviction"] = bench_eviction.run(pool_dir, quick=args.quick)
        print("## Eviction and master memory\n\n" + bench_eviction.markdown(results["eviction"]) + "\n",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
