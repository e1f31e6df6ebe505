"""The data path (section "data" of python -m mooncake_cxl.bench).

Starts a master over a pool in /dev/shm, then a writer process that puts
values of 4 KiB, 64 KiB, 1 MiB and 16 MiB, then a reader process (another
process, as on a decode node) that gets them and probes them with is_exist.
Every latency is printed beside a plain memcpy of the same size measured in
the reader process in the same run, so the ratio is meaningful on a noisy
machine. Latencies are per call through the Python API, median and p99.
Puts are timed twice: put/remove cycles (each put reuses the extent and index
entry just freed, hot in cache) and new keys as a KV cache writes them (no
removes while the keys fit in NEW_KEY_WINDOW_BYTES; beyond, the key that many
bytes back is removed, untimed). The configuration is the default one
(prefault on), and the timed calls start once the background population
has mapped the whole pool; every row names the pool's page size.
"""
import multiprocessing as mp
import os
import statistics
import time

from . import coherence as coh
from . import common, pages
from .common import KIB, MIB

# size, keys kept for the reader, timed puts, timed gets / is_exist
PLAN = [
    (4 * KIB, 2048, 4000, 20000),
    (64 * KIB, 256, 2000, 5000),
    # From 1 MiB up, enough timed puts that the p99 is not one of the few
    # slowest samples (of 200, it is the 2nd slowest).
    (1 * MIB, 32, 1000, 1000),
    (4 * MIB, 16, 500, 800),
    (16 * MIB, 8, 400, 100),
]
# Untimed put/remove/memcpy rounds before each size's timed puts: the
# baseline's setup (a working set of up to 32 MiB) leaves the master without a
# request for ms, it sleeps, and the first put after it pays a wake-up of its
# core from a long sleep (150-300 µs on this VM; the paced-put table in the
# control section shows what a put after a pause costs) and cold caches.
WARMUP_ROUNDS = 3
# Timed puts of new keys per size (at least 200 from 1 MiB up: the p99 is
# then not one of the few slowest samples), and the live bytes they keep.
NEW_KEY_PUTS = {4 * KIB: 4000, 64 * KIB: 2000, 1 * MIB: 400, 4 * MIB: 300, 16 * MIB: 200}
NEW_KEY_WINDOW_BYTES = 64 * MIB
BATCH = 32  # batch_get_into row: BATCH values of 64 KiB per call


def _key(size, i):
    return f"bench/{size}/{i}"


def _chunk(size, n):
    # Large copies alternate one by one with the baseline (bandwidth drifts on
    # a shared VM); small ones in tenths of the run, so that the baseline's
    # copies do not flush the caches before every store call.
    return 1 if size >= MIB else max(10, n // 10)


def _connect(address, prefault, pool):
    os.environ["MC_CXL_PREFAULT"] = "1" if prefault else "0"  # the default is on
    t0 = time.perf_counter()
    s = common.connect(address)
    setup_s = time.perf_counter() - t0
    if prefault:  # setup does not wait for the background population; the timed calls do
        pages.wait_resident(os.getpid(), pool[0], pool[1])
    common.settle_placement(s)
    return s, setup_s


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


def writer(address, plan, out, prefault=True, cpu=None, pool=None, new_keys=None):
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    s, setup_s = _connect(address, prefault, pool)
    results = {"setup_s": setup_s}
    for size, nkeys, nputs, _ in plan:
        for i in range(nkeys):
            if s.put(_key(size, i), common.value(size, i)) != 0:
                raise RuntimeError(f"put of {size} B failed")
        value = common.value(size, 0)

        def tmp_key(i):
            return f"bench/tmp/{size}/{i}"

        def put(i):
            rc = s.put(tmp_key(i), value)
            if rc != 0:
                raise RuntimeError(f"timed put of {size} B failed: {rc}")

        base = common.memcpy_baseline(size, size * nkeys)
        for i in range(WARMUP_ROUNDS):
            put(nputs + i)
            s.remove(tmp_key(nputs + i), force=True)
            base.run(1)
        lat, mc = [], []
        chunk = _chunk(size, nputs)
        for start in range(0, nputs, chunk):
            for i in range(start, min(nputs, start + chunk)):
                t0 = time.perf_counter_ns()
                put(i)
                lat.append(time.perf_counter_ns() - t0)
                s.remove(tmp_key(i), force=True)  # makes room; not timed
            mc += base.run(min(chunk, nputs - start))
        results[size] = {"put": (lat, mc)}
        if new_keys and size in new_keys:
            results[size]["put (new keys)"] = _new_key_puts(s, size, value, base, new_keys[size])
    s.close()
    out.put(("put", results))


def _new_key_puts(s, size, value, base, n):
    """Puts of keys never used before, interleaved with the memcpy baseline
    as the put/remove row is."""
    window = max(1, NEW_KEY_WINDOW_BYTES // size)
    lat, mc = [], []
    chunk = _chunk(size, n)
    for start in range(0, n, chunk):
        for i in range(start, min(n, start + chunk)):
            key = f"bench/new/{size}/{i}"
            t0 = time.perf_counter_ns()
            rc = s.put(key, value)
            lat.append(time.perf_counter_ns() - t0)
            if rc != 0:
                raise RuntimeError(f"put of new key {key} failed: {rc}")
            if i >= window:
                s.remove(f"bench/new/{size}/{i - window}", force=True)  # room; not timed
        mc += base.run(min(chunk, n - start))
    for i in range(max(0, n - window), n):
        s.remove(f"bench/new/{size}/{i}", force=True)
    return lat, mc


def reader(address, plan, out, prefault=True, pool=None):
    s, setup_s = _connect(address, prefault, pool)
    results = {"setup_s": setup_s}
    for size, nkeys, _, ngets in plan:
        for i in range(nkeys):  # check the data once, and warm the mapping
            if s.get(_key(size, i)) != common.value(size, i):
                raise RuntimeError(f"wrong bytes for {_key(size, i)}")
        keys = [_key(size, i) for i in range(nkeys)]
        base = common.memcpy_baseline(size, size * nkeys)
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

            # Baselines: BATCH plain memcpys of 64 KiB into BATCH distinct
            # buffers, from /dev/shm and from anonymous memory; and one plain
            # memcpy of the same 2 MiB from anonymous memory (the goal's bar).
            per = common.memcpy_baseline(size, size * nkeys, size * BATCH)
            per_anon = common.memcpy_baseline(size, size * nkeys, size * BATCH, anonymous=True)
            whole_anon = common.memcpy_baseline(size * BATCH, size * BATCH * max(1, nkeys // BATCH), size * BATCH,
                                   anonymous=True)
            nb = max(20, ngets // BATCH)
            lat, mc, mc_anon, mc_whole = [], [], [], []
            keysets = [[keys[(i * BATCH + j) % nkeys] for j in range(BATCH)] for i in range(nb)]
            for i in range(nb):  # one by one: the bandwidth drifts
                t0 = time.perf_counter_ns()
                r = s.batch_get_into(keysets[i], ptrs, sizes)
                lat.append(time.perf_counter_ns() - t0)
                if r != sizes:
                    raise RuntimeError(f"batch_get_into returned {r}")
                mc.append(sum(per.run(BATCH)))
                mc_anon.append(sum(per_anon.run(BATCH)))
                mc_whole += whole_anon.run(1)
            name = f"batch_get_into {BATCH}x{common.size_name(size)}"
            results[size * BATCH] = {name: (lat, mc), name + " vs anonymous memcpy": (lat, mc_whole),
                                     name + " vs 32 anonymous memcpys": (lat, mc_anon)}
    results["page"] = pages.page_size(os.getpid(), pool[0])
    s.close()
    out.put(("read", results))


def run(quick=False, pool_dir="/dev/shm", prefault=True, coherence="coherent"):
    with coh.build_env(coherence, 0):
        result = _run(quick, pool_dir, prefault, coh.master_flags(coherence), coh.mapped_suffix(coherence))
    result["coherence"] = coherence
    return result


def _run(quick, pool_dir, prefault, coherence_flags, mapped_suffix):
    from ..launch import MasterProcess
    plan = [(s, max(2, k // 4), max(10, p // 10), max(20, g // 10)) for s, k, p, g in PLAN] if quick else PLAN
    pool_bytes = sum(size * (nkeys + 2) for size, nkeys, _, _ in plan) * 2 + 64 * MIB + 2 * NEW_KEY_WINDOW_BYTES
    ctx = mp.get_context("spawn")
    new_keys = {s: max(10, n // 10) for s, n in NEW_KEY_PUTS.items()} if quick else NEW_KEY_PUTS
    flags = ([] if prefault else ["--prefault_pool=false"]) + coherence_flags
    t0 = time.perf_counter()
    with common.temp_pool("mcxl_bench", pool_dir) as pool, \
            MasterProcess(pool, pool_bytes, format=True, extra_flags=flags) as m:
        master_start_s = time.perf_counter() - t0
        populated_s = pages.wait_allocated(pool, m.pool_size) if prefault else None
        q = ctx.Queue()
        rows = {}
        for target in (writer, reader):
            p = ctx.Process(target=target, args=(m.address, plan, q, prefault),
                            kwargs={"pool": (pool + mapped_suffix, m.pool_size)} if target is reader else
                            {"pool": (pool + mapped_suffix, m.pool_size), "new_keys": new_keys})
            p.start()
            kind, data = q.get(timeout=600)
            p.join()
            rows[kind] = data
        placed = None if quick else _put_on_separate_cores(ctx, m, prefault, (pool + mapped_suffix, m.pool_size))
    setup = {"master_start_s": master_start_s, "writer_setup_s": rows["put"].pop("setup_s"),
             "reader_setup_s": rows["read"].pop("setup_s"), "master_populated_s": populated_s}
    page = rows["read"].pop("page")
    table = []
    merged = {}
    for part in ("put", "read"):
        for size, ops in rows[part].items():
            merged.setdefault(size, {}).update(ops)
    order = ["put", "put (new keys)", "get", "get_into", "get_buffer", "is_exist"]
    for size in sorted(merged):
        for op in sorted(merged[size], key=lambda o: order.index(o) if o in order else len(order)):
            lat, base = merged[size][op]
            med, p99 = common.percentiles(lat)
            mc_med, mc_p99 = common.percentiles(base)
            # Calls and copies alternating one by one (large sizes): the median
            # of the per-pair ratios cancels drift better than a ratio of medians.
            paired = len(lat) == len(base) and (_chunk(size, len(lat)) == 1 or op.startswith("batch"))
            ratio = statistics.median(b / a for a, b in zip(lat, base)) if paired else mc_med / med
            table.append({
                "op": op, "size": size, "median_us": med, "p99_us": p99,
                "gbps": size / (med * 1e3), "memcpy_median_us": mc_med, "memcpy_p99_us": mc_p99,
                "memcpy_gbps": size / (mc_med * 1e3), "vs_memcpy": ratio, "samples": len(lat),
                "p99_over_median": p99 / med, "page": page,
            })
    return {"machine": common.machine(), "quick": quick, "prefault": prefault, "setup": setup,
            "pool_bytes": pool_bytes, "rows": table, "put_4k_separate_cores": placed}


def _put_on_separate_cores(ctx, master, prefault, pool):
    """4 KiB puts as the writer times them, with the writer on CPU 0 and every
    master thread on the last CPU. Unpinned, the kernel at first often runs a new
    client on the core of the ring thread it wakes (a ring ping: 4.2 µs on one
    core vs 0.7 µs on two, measured with taskset) and moves one of them only
    after tens of ms, so the unpinned median depends on where the scheduler put
    the processes; this row shows the figure without that."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    everything = set(cpus)
    common.set_process_affinity(master.proc.pid, {cpus[-1]})
    try:
        q = ctx.Queue()
        p = ctx.Process(target=writer, args=(master.address, [(4 * KIB, 16, 4000, 0)], q, prefault, cpus[0]),
                        kwargs={"pool": pool})
        p.start()
        _, data = q.get(timeout=600)
        p.join()
    finally:
        common.set_process_affinity(master.proc.pid, everything)
    lat, _ = data[4 * KIB]["put"]
    med, p99 = common.percentiles(lat)
    return {"median_us": med, "p99_us": p99, "writer_cpu": cpus[0], "master_cpu": cpus[-1], "samples": len(lat)}


def _coherence_note(result):
    mode = result.get("coherence", "coherent")
    return "" if mode == "coherent" else f" Pool mode: {mode} (--coherence {mode})."


def markdown(result):
    lines = ["Latency per call through the Python API; writer and reader are separate processes. "
             "Each row's memcpy is a plain single-thread memcpy of the same size from a /dev/shm "
             "mapping (the pool's medium), timed in the same process, interleaved with that row's "
             "calls so that both see the same drift; from 1 MiB up they alternate one by one and "
             "the ratio is the median of the per-pair ratios." + _coherence_note(result), "",
             "| op | size | pool page | median µs | p99 µs | p99 ÷ median | GB/s (median) | memcpy median µs | memcpy GB/s | store ÷ memcpy bandwidth |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        moves_data = r["op"] not in ("is_exist", "get_buffer")  # they copy nothing
        gbps = f"{r['gbps']:.2f}" if moves_data else "—"
        ratio = f"{r['vs_memcpy'] * 100:.0f}%" if moves_data else "—"
        tail = r.get("p99_over_median", r["p99_us"] / r["median_us"])
        page = r.get("page", "?") if moves_data else "—"
        lines.append(f"| {r['op']} | {common.size_name(r['size'])} | {page} | {r['median_us']:.2f} | {r['p99_us']:.2f} | "
                     f"{tail:.1f}× | {gbps} | {r['memcpy_median_us']:.2f} | {r['memcpy_gbps']:.2f} | {ratio} |")
    st = result.get("setup")
    if st:
        pop = st.get("master_populated_s")
        lines += ["", f"Pool of {result['pool_bytes'] / MIB:.0f} MiB, prefault "
                  f"{'on (the default; timed calls start once the pool is populated)' if result.get('prefault') else 'off (--prefault_pool=false, MC_CXL_PREFAULT=0)'}: "
                  f"master start {st['master_start_s'] * 1e3:.0f} ms"
                  f"{f' (its background population done {pop * 1e3:.0f} ms later)' if pop is not None else ''}, "
                  f"writer setup {st['writer_setup_s'] * 1e3:.0f} ms, reader setup {st['reader_setup_s'] * 1e3:.0f} ms."]
    return "\n".join(lines)
