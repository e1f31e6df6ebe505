"""The three builds of the publish primitives (section "coherence" of
python -m mooncake_cxl.bench, only with --only coherence).

One run, the builds alternating round by round: coherent (a pool formatted
--coherence=coherent: fences only), real non-coherent (--coherence=noncoherent:
clwb/clflushopt + fences on this machine's DRAM) and simulated (the same pool
mode with MC_CXL_SIM_HOST: the master on simulated host 0, the client on
host SIM_CLIENT_HOST, churn off, so that the rows time the simulator's line
copies and the discipline's cross-host traffic, not random write-backs).
Each round starts a fresh master and one client process, which times put,
get and is_exist of 4 KiB, get_into of 4 MiB, batch_get_into of 32 x 64 KiB
and a ring round trip (health_check). Ratios are medians over the coherent
build's in the same run.
"""
import contextlib
import multiprocessing as mp
import time

from . import common
from .common import KIB, MIB

BUILDS = ("coherent", "noncoherent", "simulated")
ROUNDS = 3
SIM_CLIENT_HOST = 1
# Bytes of values each read row cycles through: twice this machine's 32 MiB L3,
# so the coherent build reads from memory as a large KV cache does, not from
# an L3 the non-coherent build must evict.
WORKING_SET = 64 * MIB
BATCH = 32
OPS = ("put 4 KiB", "get 4 KiB", "is_exist 4 KiB", "get_into 4 MiB", f"batch_get_into {BATCH}x64 KiB",
       "ring round trip")


@contextlib.contextmanager
def build_env(build, host):
    """MC_CXL_SIM_HOST=host (churn off) while the block runs, for the simulated build."""
    env = dict(MC_CXL_SIM_HOST=str(host), MC_CXL_SIM_CHURN="0", MC_CXL_SIM_SEED="1") if build == "simulated" else {}
    saved = common.set_environ(env)
    try:
        yield
    finally:
        common.restore_environ(saved)


def mapped_suffix(build):
    """What a client on host 0 maps instead of the pool file (its host copy)."""
    return ".simhost-0" if build == "simulated" else ""


def master_flags(build):
    return [] if build == "coherent" else ["--coherence=noncoherent"]


def _timed(fn, n):
    out = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        fn(i)
        out.append(time.perf_counter_ns() - t0)
    return out


def _client(address, n, q):
    import numpy as np
    s = common.connect(address)
    common.settle_placement(s)
    small = common.value(4 * KIB, 1)
    out = {}
    nkeys = WORKING_SET // (4 * KIB)
    for i in range(nkeys):
        assert s.put(f"c/{i}", small) == 0
    out["put 4 KiB"] = _timed(lambda i: s.put(f"p/{i}", small), n)
    spread = 7919  # a prime: n < nkeys reads touch n different values, none read just before
    out["get 4 KiB"] = _timed(lambda i: s.get(f"c/{i * spread % nkeys}"), n)
    out["is_exist 4 KiB"] = _timed(lambda i: s.is_exist(f"c/{i * spread % nkeys}"), n)
    big = common.value(4 * MIB, 2)
    nbig = WORKING_SET // (4 * MIB)
    for i in range(nbig):
        assert s.put(f"big/{i}", big) == 0
    dst = np.zeros(4 * MIB, dtype=np.uint8)
    s.register_buffer(dst.ctypes.data, dst.nbytes)
    out["get_into 4 MiB"] = _timed(lambda i: s.get_into(f"big/{i % nbig}", dst.ctypes.data, 4 * MIB), max(20, n // 50))
    mid = common.value(64 * KIB, 3)
    nmid = WORKING_SET // (64 * KIB)
    for i in range(nmid):
        assert s.put(f"mid/{i}", mid) == 0
    bufs = np.zeros(BATCH * 64 * KIB, dtype=np.uint8)
    s.register_buffer(bufs.ctypes.data, bufs.nbytes)
    ptrs = [bufs.ctypes.data + j * 64 * KIB for j in range(BATCH)]
    sizes = [64 * KIB] * BATCH
    keysets = [[f"mid/{i * BATCH + j}" for j in range(BATCH)] for i in range(nmid // BATCH)]
    out[f"batch_get_into {BATCH}x64 KiB"] = _timed(lambda i: s.batch_get_into(keysets[i % len(keysets)], ptrs, sizes),
                                                   max(20, n // 50))
    out["ring round trip"] = _timed(lambda i: s.health_check(), n)
    ok = s.get("c/0") == small and bytes(dst[:16]) == big[:16]
    s.unregister_buffer(dst.ctypes.data)
    s.unregister_buffer(bufs.ctypes.data)
    s.remove_all(force=True)
    s.close()
    q.put((out, ok))


def _round(build, n, pool_dir, ctx):
    from ..launch import MasterProcess
    with common.temp_pool("mcxl_bench_coh", pool_dir) as pool:
        with build_env(build, 0):
            m = MasterProcess(pool, 4 * WORKING_SET + 128 * MIB, format=True, extra_flags=master_flags(build)).start()
        try:
            with build_env(build, SIM_CLIENT_HOST):
                q = ctx.Queue()
                p = ctx.Process(target=_client, args=(m.address, n, q))
                p.start()
            out, ok = q.get(timeout=900)
            p.join()
        finally:
            m.stop()
    return out, ok


def run(quick=False, pool_dir="/dev/shm"):
    ctx = mp.get_context("spawn")
    n = 200 if quick else 2000
    samples = {b: {op: [] for op in OPS} for b in BUILDS}
    checked = {b: True for b in BUILDS}
    for _ in range(1 if quick else ROUNDS):
        for build in BUILDS:  # alternating: drift hits every build alike
            out, ok = _round(build, n, pool_dir, ctx)
            checked[build] &= ok
            for op, v in out.items():
                samples[build][op] += v
    rows = []
    for op in OPS:
        med = {b: common.percentiles(samples[b][op])[0] for b in BUILDS}
        rows.append({"op": op, **{f"{b}_median_us": med[b] for b in BUILDS},
                     **{f"{b}_ratio": med[b] / med["coherent"] for b in BUILDS if b != "coherent"}})
    return {"rows": rows, "rounds": 1 if quick else ROUNDS, "samples": n, "values_checked": checked,
            "write_back": _write_back_instruction(), "sim_client_host": SIM_CLIENT_HOST}


def _write_back_instruction():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    return "clwb" if "clwb" in flags else "clflushopt" if "clflushopt" in flags else "clflush"


def markdown(result):
    lines = [f"Medians over {result['rounds']} rounds, the three builds alternating (a fresh master and one "
             "client each round); ratios against the coherent build in the same run; each read row cycles "
             f"through {WORKING_SET // MIB} MiB of values. Real non-coherent "
             f"writes lines back with `{result['write_back']}` and evicts them with `clflushopt` on this "
             "machine's DRAM; simulated: master on host 0, client on host "
             f"{result.get('sim_client_host', SIM_CLIENT_HOST)}, churn off.", "",
             "| op | coherent µs | non-coherent µs | ÷ coherent | simulated µs | ÷ coherent |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['op']} | {r['coherent_median_us']:.2f} | {r['noncoherent_median_us']:.2f} | "
                     f"{r['noncoherent_ratio']:.2f}× | {r['simulated_median_us']:.2f} | {r['simulated_ratio']:.2f}× |")
    bad = [b for b, ok in result["values_checked"].items() if not ok]
    if bad:
        lines += ["", f"Values read back wrong in: {', '.join(bad)}."]
    return "\n".join(lines)
