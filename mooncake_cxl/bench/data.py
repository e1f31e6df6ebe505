"""The data path (section "data" of python -m mooncake_cxl.bench).

Starts a master over a pool in /dev/shm, then a writer process that puts
values of 4 KiB, 64 KiB, 1 MiB and 16 MiB, then a reader process (another
process, as on a decode node) that gets them and probes them with is_exist.
Every latency is printed beside a plain memcpy of the same size measured in
the reader process in the same run, so the ratio is meaningful on a noisy
machine. Latencies are per call through the Python API, median and p99.
"""
import multiprocessing as mp
import os
import statistics
import time

from . import common
from .common import KIB, MIB

# size, keys kept for the reader, timed puts, timed gets / is_exist
PLAN = [
    (4 * KIB, 2048, 4000, 20000),
    (64 * KIB, 256, 2000, 5000),
    (1 * MIB, 32, 300, 1000),
    (4 * MIB, 16, 100, 800),
    (16 * MIB, 8, 40, 100),
]
BATCH = 32  # batch_get_into row: BATCH values of 64 KiB per call


def _key(size, i):
    return f"bench/{size}/{i}"


def _chunk(size, n):
    # Large copies alternate one by one with the baseline (bandwidth drifts on
    # a shared VM); small ones in tenths of the run, so that the baseline's
    # copies do not flush the caches before every store call.
    return 1 if size >= MIB else max(10, n // 10)


def _baseline(size, working_set, dst_working_set=0):
    from mooncake_cxl import _core
    # From a /dev/shm mapping: the pool's own medium.
    return _core._MemcpyBench(size, working_set, dst_working_set, "/dev/shm" if os.path.isdir("/dev/shm") else "")


def _aligned(shape):
    """Zeroed uint8 array whose data starts on a page boundary, as the KV
    blocks of inference engines do (unaligned buffers copy slower)."""
    import numpy as np
    n = int(np.prod(shape))
    raw = np.zeros(n + 4096, dtype=np.uint8)
    off = (-raw.ctypes.data) % 4096
    return raw[off:off + n].reshape(shape)


def _interleaved(op, baseline, n, chunk):
    """Times op(i) for i < n and, between chunks, as many plain memcpys of
    the same size: both see the same machine drift. Returns (op_ns, memcpy_ns)."""
    op_ns, base_ns = [], []
    for start in range(0, n, chunk):
        for i in range(start, min(n, start + chunk)):
            t0 = time.perf_counter_ns()
            op(i)
            op_ns.append(time.perf_counter_ns() - t0)
        base_ns += baseline.run(min(chunk, n - start))
    return op_ns, base_ns


def writer(address, plan, out):
    s = common.connect(address)
    results = {}
    for size, nkeys, nputs, _ in plan:
        for i in range(nkeys):
            if s.put(_key(size, i), common.value(size, i)) != 0:
                raise RuntimeError(f"put of {size} B failed")
        value = common.value(size, 0)

        def put(i):
            rc = s.put(f"bench/tmp/{size}/{i}", value)
            if rc != 0:
                raise RuntimeError(f"timed put of {size} B failed: {rc}")

        base = _baseline(size, size * nkeys)
        lat, mc = [], []
        chunk = _chunk(size, nputs)
        for start in range(0, nputs, chunk):
            for i in range(start, min(nputs, start + chunk)):
                t0 = time.perf_counter_ns()
                put(i)
                lat.append(time.perf_counter_ns() - t0)
                s.remove(f"bench/tmp/{size}/{i}", force=True)  # makes room; not timed
            mc += base.run(min(chunk, nputs - start))
        results[size] = {"put": (lat, mc)}
    s.close()
    out.put(("put", results))


def reader(address, plan, out):
    s = common.connect(address)
    results = {}
    for size, nkeys, _, ngets in plan:
        for i in range(nkeys):  # check the data once, and warm the mapping
            if s.get(_key(size, i)) != common.value(size, i):
                raise RuntimeError(f"wrong bytes for {_key(size, i)}")
        keys = [_key(size, i) for i in range(nkeys)]
        base = _baseline(size, size * nkeys)
        chunk = _chunk(size, ngets)
        rows = results.setdefault(size, {})

        def get(i):
            if len(s.get(keys[i % nkeys])) != size:
                raise RuntimeError("short read")

        def exist(i):
            if s.is_exist(keys[i % nkeys]) != 1:
                raise RuntimeError("is_exist missed")

        dst = _aligned(size)
        s.register_buffer(dst.ctypes.data, dst.nbytes)

        dst_ptr = dst.ctypes.data  # once: building it costs about a microsecond

        def get_into(i):
            r = s.get_into(keys[i % nkeys], dst_ptr, size)
            if r != size:
                raise RuntimeError(f"get_into returned {r}")

        def get_buffer(i):
            h = s.get_buffer(keys[i % nkeys])
            if h is None or len(h) != size:
                raise RuntimeError("get_buffer missed")

        rows["get"] = _interleaved(get, base, ngets, chunk)
        rows["get_into"] = _interleaved(get_into, base, ngets, chunk)
        # These copy nothing: timed in one run, so the baseline's copies do not
        # turn their few cache lines cold.
        rows["get_buffer"] = _interleaved(get_buffer, base, ngets, ngets)
        rows["is_exist"] = _interleaved(exist, base, ngets, ngets)
        s.unregister_buffer(dst.ctypes.data)
        if size == 64 * KIB and nkeys >= BATCH:
            bufs = _aligned((BATCH, size))
            s.register_buffer(bufs.ctypes.data, bufs.nbytes)
            ptrs = [bufs.ctypes.data + j * size for j in range(BATCH)]
            sizes = [size] * BATCH

            def batch(i):
                r = s.batch_get_into([keys[(i * BATCH + j) % nkeys] for j in range(BATCH)], ptrs, sizes)
                if r != sizes:
                    raise RuntimeError(f"batch_get_into returned {r}")

            # Baseline: BATCH plain memcpys of 64 KiB into BATCH distinct buffers.
            per = _baseline(size, size * nkeys, size * BATCH)
            nb = max(20, ngets // BATCH)
            chunk = max(5, nb // 10)
            lat, mc = [], []
            for start in range(0, nb, chunk):
                for i in range(start, min(nb, start + chunk)):
                    t0 = time.perf_counter_ns()
                    batch(i)
                    lat.append(time.perf_counter_ns() - t0)
                mc += [sum(per.run(BATCH)) for _ in range(start, min(nb, start + chunk))]
            results[size * BATCH] = {f"batch_get_into {BATCH}x{common.size_name(size)}": (lat, mc)}
    s.close()
    out.put(("read", results))


def run(quick=False, pool_dir="/dev/shm"):
    from ..launch import MasterProcess
    plan = [(s, max(2, k // 4), max(10, p // 10), max(20, g // 10)) for s, k, p, g in PLAN] if quick else PLAN
    pool_bytes = sum(size * (nkeys + 2) for size, nkeys, _, _ in plan) * 2 + 64 * MIB
    ctx = mp.get_context("spawn")
    with common.temp_pool("mcxl_bench", pool_dir) as pool, MasterProcess(pool, pool_bytes, format=True) as m:
        q = ctx.Queue()
        rows = {}
        for target in (writer, reader):
            p = ctx.Process(target=target, args=(m.address, plan, q))
            p.start()
            kind, data = q.get(timeout=600)
            p.join()
            rows[kind] = data
    table = []
    merged = {}
    for part in ("put", "read"):
        for size, ops in rows[part].items():
            merged.setdefault(size, {}).update(ops)
    order = ["put", "get", "get_into", "get_buffer", "is_exist"]
    for size in sorted(merged):
        for op in sorted(merged[size], key=lambda o: order.index(o) if o in order else len(order)):
            lat, base = merged[size][op]
            med, p99 = common.percentiles(lat)
            mc_med, _ = common.percentiles(base)
            # Calls and copies alternating one by one (large sizes): the median
            # of the per-pair ratios cancels drift better than a ratio of medians.
            paired = len(lat) == len(base) and _chunk(size, len(lat)) == 1
            ratio = statistics.median(b / a for a, b in zip(lat, base)) if paired else mc_med / med
            table.append({
                "op": op, "size": size, "median_us": med, "p99_us": p99,
                "gbps": size / (med * 1e3), "memcpy_median_us": mc_med,
                "memcpy_gbps": size / (mc_med * 1e3), "vs_memcpy": ratio, "samples": len(lat),
            })
    return {"machine": common.machine(), "quick": quick, "rows": table}


def markdown(result):
    lines = [f"Machine: {result['machine']}", "",
             "Latency per call through the Python API; writer and reader are separate processes. "
             "Each row's memcpy is a plain single-thread memcpy of the same size from a /dev/shm "
             "mapping (the pool's medium), timed in the same process, interleaved with that row's "
             "calls so that both see the same drift; from 1 MiB up they alternate one by one and "
             "the ratio is the median of the per-pair ratios.", "",
             "| op | size | median µs | p99 µs | GB/s (median) | memcpy median µs | memcpy GB/s | store ÷ memcpy bandwidth |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        moves_data = r["op"] not in ("is_exist", "get_buffer")  # they copy nothing
        gbps = f"{r['gbps']:.2f}" if moves_data else "—"
        ratio = f"{r['vs_memcpy'] * 100:.0f}%" if moves_data else "—"
        lines.append(f"| {r['op']} | {common.size_name(r['size'])} | {r['median_us']:.2f} | {r['p99_us']:.2f} | "
                     f"{gbps} | {r['memcpy_median_us']:.2f} | {r['memcpy_gbps']:.2f} | {ratio} |")
    return "\n".join(lines)
