"""Master high availability (section "ha" of python -m mooncake_cxl.bench,
--only ha; needs etcd: apt-get install etcd-server).

Takeover time: from the leader's SIGKILL (or SIGSTOP: a leader that stops
answering, as one on another host or cut off from etcd would) to the first
put acknowledged through the new leader, as a client with an etcd://
address sees it; median of several runs, with pools holding 1 k and 1 M
objects. A SIGKILLed leader on the standby's host is found dead at once (its
lease is revoked); a stopped one costs the lease TTL. Then the cost of HA on
the hot path: 4 KiB puts against an elected master and a single master,
alternating rounds in the same run.
"""
import os
import shutil
import signal
import statistics
import tempfile
import time

from . import common
from .common import KIB, MIB

TTL_S = 2


def _fill(store, count):
    value = b"h" * 64
    for b in range(0, count, 1000):
        keys = [f"obj{i:07d}" for i in range(b, min(count, b + 1000))]
        rc = store.put_batch(keys, [value] * len(keys))
        assert rc == 0, rc


def _until_put(store, key):
    while store.put(key, b"t" * 64) != 0:
        pass  # each failed put already waited for the new leader (MC_CXL_PUT_WAIT_MS)


def _wait_stopped(pid):
    """Until the kernel shows `pid` stopped (a signal is delivered asynchronously)."""
    while True:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return


def _takeovers(etcd, path, pool_bytes, count, runs, how, log_dir):
    from ..launch_ha import HaMasterProcess
    flags = [f"--index_capacity={2 * count}"]
    n = [0]

    def master():
        n[0] += 1
        return HaMasterProcess(etcd.endpoint, path, pool_bytes, ttl_s=TTL_S, extra_flags=flags,
                               log_path=os.path.join(log_dir, f"{how}{count}-{n[0]}.log")).start()

    leader = master()
    assert leader.wait_ready(120), leader.log_tail()
    s = common.connect(etcd.client_address)
    _fill(s, count)
    times, paused = [], []
    try:
        for r in range(runs):
            standby = master()
            t0 = time.perf_counter()
            if how == "kill":
                leader.kill()
            else:
                os.kill(leader.proc.pid, signal.SIGSTOP)
                paused.append(leader)
                _wait_stopped(leader.proc.pid)
            _until_put(s, f"probe/{how}/{r}")
            times.append(time.perf_counter() - t0)
            assert standby.wait_ready(60), standby.log_tail()
            leader = standby
        assert s.get("obj0000000") == b"h" * 64
    finally:
        s.close()
        for m in paused + [leader]:
            if m.proc and m.proc.poll() is None:
                os.kill(m.proc.pid, signal.SIGCONT)
            m.kill()
    return times


def _put_cost(etcd, pool_dir, rounds, n):
    """Per-put seconds of 4 KiB puts, HA off and on, alternating rounds."""
    from ..launch import MasterProcess
    from ..launch_ha import HaMasterProcess
    os.environ["MC_CXL_PREFAULT"] = "1"
    value = b"p" * (4 * KIB)
    out = {"off": [], "on": []}
    with common.temp_pool("mcxl_bench_ha_off", pool_dir) as p_off, \
            common.temp_pool("mcxl_bench_ha_on", pool_dir) as p_on:
        off = MasterProcess(p_off, 256 * MIB, format=True, extra_flags=["--prefault_pool"]).start()
        on = HaMasterProcess(etcd.endpoint, p_on, 256 * MIB, ttl_s=TTL_S, extra_flags=["--prefault_pool"],
                             cluster_id="bench-put").start()
        try:
            assert on.wait_ready(60), on.log_tail()
            stores = {"off": common.connect(off.address), "on": None}
            os.environ["MC_STORE_CLUSTER_ID"] = "bench-put"
            stores["on"] = common.connect(etcd.client_address)
            del os.environ["MC_STORE_CLUSTER_ID"]
            for s in stores.values():
                common.settle_placement(s)
            for r in range(rounds):
                for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                    s = stores[mode]
                    s.remove_all(force=True)
                    t0 = time.perf_counter()
                    for i in range(n):
                        assert s.put(f"k{r}/{i}", value) == 0
                    out[mode].append((time.perf_counter() - t0) / n)
            for s in stores.values():
                s.close()
        finally:
            off.stop()
            on.stop()
    return out


def run(quick=False, pool_dir="/dev/shm"):
    from ..launch_ha import EtcdProcess
    if not EtcdProcess.available():
        raise RuntimeError("the ha section needs etcd (apt-get install etcd-server)")
    result = {"ttl_s": TTL_S}
    os.environ.setdefault("MC_CXL_PUT_WAIT_MS", "10000")
    tmp = tempfile.mkdtemp(prefix="mcxl_bench_ha_")
    etcd = EtcdProcess(os.path.join(tmp, "etcd"), log_path=os.path.join(tmp, "etcd.log")).start()
    try:
        runs = 3 if quick else 5
        for count in ((1000, 100_000) if quick else (1000, 1_000_000)):
            pool_bytes = max(256 * MIB, count * 192 + 2 * count * 64 + 64 * MIB)
            for how in ("kill", "stop"):
                with common.temp_pool("mcxl_bench_ha", pool_dir) as path:
                    t = _takeovers(etcd, path, pool_bytes, count, runs, how, tmp)
                result[f"takeover_{how}_{count}_ms"] = [x * 1e3 for x in t]
        cost = _put_cost(etcd, pool_dir, 5 if quick else 21, 500 if quick else 2000)
        ratios = sorted(on / off for on, off in zip(cost["on"], cost["off"]))
        result["put_4k_off_us"] = statistics.median(cost["off"]) * 1e6
        result["put_4k_on_us"] = statistics.median(cost["on"]) * 1e6
        result["ha_put_cost"] = statistics.median(ratios) - 1
        result["ha_put_cost_quartiles"] = [ratios[len(ratios) // 4] - 1, ratios[(3 * len(ratios)) // 4] - 1]
        result["put_rounds"] = len(ratios)
    finally:
        etcd.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def markdown(r):
    rows = ["| takeover (leader fault to the first put through the new leader) | objects | median ms | runs (ms) |",
            "|---|---:|---:|---|"]
    for key, value in r.items():
        if key.startswith("takeover_"):
            _, how, count, _ = key.split("_")
            what = "leader SIGKILL (dead on the standby's host)" if how == "kill" else \
                f"leader SIGSTOP (stops answering: the lease TTL, {r['ttl_s']} s)"
            rows.append(f"| {what} | {int(count):,} | {statistics.median(value):.0f} | "
                        f"{', '.join(f'{x:.0f}' for x in value)} |")
    q = r["ha_put_cost_quartiles"]
    rows += ["", f"4 KiB put: {r['put_4k_off_us']:.2f} µs single master, {r['put_4k_on_us']:.2f} µs elected "
             f"(--enable_ha): HA costs {r['ha_put_cost'] * 100:+.1f}% (median of {r['put_rounds']} alternating "
             f"rounds; quartiles {q[0] * 100:+.1f}% / {q[1] * 100:+.1f}%)."]
    return "\n".join(rows)
