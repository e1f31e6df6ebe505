"""`--only remote`: a client outside the pod (values over Mooncake's Transfer
Engine, TCP) against Mooncake 0.3.13's own store doing the same over TE-TCP,
with TE's raw transfer of the same bytes and a local (pool-mapped) client
beside them. Everything runs in one child under `unshare -n` (every engine
binds 0.0.0.0); each iteration runs the four once each, in turn, so the
figures are same-run ratios on a machine whose load changes.

Mooncake's data lives in the segment of a second client process (a holder
with global_segment_size > 0); the measured Mooncake client contributes none,
so its gets and puts cross TE-TCP as ours do.

A second table: a client's reads of values in its own DRAM segment
(MC_CXL_DRAM_SEGMENT=1, placed with prefer_alloc_in_same_node), of values in
another client process's segment (over that owner's Transfer Engine, TCP)
and of pool values, alternating.
"""
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from . import common, reference
from .common import KIB, MIB

SIZES = (4 * KIB, 64 * KIB, MIB, 16 * MIB)
BATCH = (32, 64 * KIB)
IMPLS = ("ours", "mooncake", "raw", "local")
_MARK = "MCXL_REMOTE_RESULT "


def _iters(size, quick):
    n = 200 if size <= 64 * KIB else 40 if size <= MIB else 8
    return max(3, n // 5) if quick else n


def skip_reason():
    return reference.netns_skip_reason("every Transfer Engine")


def run(quick=False, pool_dir=None):
    why = skip_reason()
    if why:
        print(f"remote section skipped: {why}", flush=True)
        return {"skipped": why}
    return reference.run_child_in_netns(
        "mooncake_cxl.bench.remote", {"quick": quick, "pool_dir": pool_dir or common.default_pool_dir()},
        _MARK, "remote", timeout=3600)


# ---------------------------------------------------------------- child side

class _Buf:
    def __init__(self, n, fill=0):
        self.raw = ctypes.create_string_buffer(bytes([fill]) * n, n)
        self.ptr = ctypes.addressof(self.raw)
        self.n = n


def _holder(address):
    """A Mooncake client process that holds the segment the measured one writes to."""
    code = ("import signal,sys; from mooncake.store import MooncakeDistributedStore as S; s=S(); "
            f"rc=s.setup('127.0.0.1:{common.free_port()}','P2PHANDSHAKE',{1024 * MIB},{64 * MIB},'tcp','',"
            f"'{address}'); print('ready', rc, flush=True); signal.pause()")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         preexec_fn=reference.die_with_parent)
    line = p.stdout.readline().decode()
    if not line.startswith("ready 0"):
        raise RuntimeError(f"Mooncake segment holder failed: {line!r}")
    return p


_SEGMENT_OWNER = """
import os, sys
os.environ["MC_CXL_DRAM_SEGMENT"] = "1"
from mooncake_cxl import MooncakeDistributedStore, ReplicateConfig
from mooncake_cxl.bench import common
s = MooncakeDistributedStore()
rc = s.setup(f"127.0.0.1:{common.free_port()}", "P2PHANDSHAKE", 256 << 20, 0, "cxl", "", sys.argv[1])
near = ReplicateConfig()
near.prefer_alloc_in_same_node = True
for size in map(int, sys.argv[2:]):
    rc = rc or s.put(f"peer-{size}", common.value(size, 3), near)
print("ready", rc, flush=True)
sys.stdin.read()
s.close()
"""


def _segment_owner(address):
    """Another client process whose segment holds peer-<size> values."""
    p = subprocess.Popen([sys.executable, "-c", _SEGMENT_OWNER, address] + [str(n) for n in SIZES],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         preexec_fn=reference.die_with_parent)
    line = p.stdout.readline().decode()
    if not line.startswith("ready 0"):
        raise RuntimeError(f"segment owner failed: {line!r}")
    return p


def _stores(cfg, d):
    from mooncake.store import MooncakeDistributedStore as RefStore

    from ..launch import RemoteServedMaster
    from mooncake_cxl import MooncakeDistributedStore
    master = RemoteServedMaster(os.path.join(d, "pool"), os.path.join(d, "secret"), pool_size=1024 * MIB,
                                format=True)
    master.start()
    local = common.connect(master.address)
    os.environ.update(MC_CXL_REMOTE="1", MC_CXL_AUTH_TOKEN_FILE=master.auth_token_file)
    ours = MooncakeDistributedStore()
    rc = ours.setup(f"127.0.0.1:{common.free_port()}", "P2PHANDSHAKE", 0, 0, "tcp", "", master.address)
    os.environ.pop("MC_CXL_REMOTE")
    if rc != 0:
        raise RuntimeError(f"remote setup failed: {rc}")
    ref_master = reference.ReferenceMaster(os.path.join(d, "mooncake_master.log")).start()
    holder = _holder(ref_master.address)
    ref = RefStore()
    rc = ref.setup(f"127.0.0.1:{common.free_port()}", "P2PHANDSHAKE", 0, 256 * MIB, "tcp", "", ref_master.address)
    if rc != 0:
        raise RuntimeError(f"Mooncake setup failed: {rc}")
    return master, local, ours, ref, ref_master, holder


def _raw_target(ours, size):
    """A pool offset with `size` bytes the raw transfers read and write: the
    value of a key put for the purpose (its extent is ours while it lives)."""
    key = f"raw-{size}"
    ours.put(key, common.value(size, 0))
    c = ours._remote
    it = c.locate([c.stored(key)])[0]
    return it[4]


def _measure(ops, n):
    """ops: {impl: callable(i)}; each iteration runs every impl once, in turn."""
    ns = {k: [] for k in ops}
    for i in range(n):
        for k, op in ops.items():
            t = time.perf_counter_ns()
            op(i)
            ns[k].append(time.perf_counter_ns() - t)
    return {k: common.percentiles(v)[0] for k, v in ns.items()}


def _rows(cfg, local, ours, ref):
    quick = cfg["quick"]
    c = ours._remote
    te, sess = c.te, c.session
    rows = []
    ref_regs = []

    def reg(buf):
        ref.register_buffer(buf.ptr, buf.n)
        ref_regs.append(buf)
        return buf
    for size in SIZES:
        n = _iters(size, quick)
        v = common.value(size, 1)
        for s in (local, ours, ref):
            s.put(f"get-{size}", v)
        off = _raw_target(ours, size)
        dst = {k: reg(_Buf(size)) if k == "mooncake" else _Buf(size) for k in IMPLS}
        src = {k: reg(_Buf(size, 7)) if k == "mooncake" else _Buf(size, 7) for k in IMPLS}
        raw_read = lambda i: te.transfer_sync_read(sess, dst["raw"].ptr, c.base + off, size)  # noqa: E731
        raw_write = lambda i: te.transfer_sync_write(sess, src["raw"].ptr, c.base + off, size)  # noqa: E731
        k = f"get-{size}"
        rows.append(("get", size, _measure({"ours": lambda i: ours.get(k), "mooncake": lambda i: ref.get(k),
                                            "raw": raw_read, "local": lambda i: local.get(k)}, n)))
        rows.append(("get_into", size, _measure({
            "ours": lambda i: ours.get_into(k, dst["ours"].ptr, size),
            "mooncake": lambda i: ref.get_into(k, dst["mooncake"].ptr, size),
            "raw": raw_read, "local": lambda i: local.get_into(k, dst["local"].ptr, size)}, n)))
        rows.append(("put", size, _measure({
            "ours": lambda i: ours.put_from(f"p-{size}-{i}", src["ours"].ptr, size),
            "mooncake": lambda i: ref.put_from(f"p-{size}-{i}", src["mooncake"].ptr, size),
            "raw": raw_write, "local": lambda i: local.put_from(f"pl-{size}-{i}", src["local"].ptr, size)}, n)))
        for s in (ours, ref):
            s.batch_remove([f"p-{size}-{i}" for i in range(n)], True)
        local.batch_remove([f"pl-{size}-{i}" for i in range(n)], True)
    count, size = BATCH
    n = _iters(size, quick) // 4
    keys = [f"b-{j}" for j in range(count)]
    for s in (local, ours, ref):
        s.put_batch(keys, [common.value(size, j) for j in range(count)])
    offs = [_raw_target(ours, size)] * count
    dst = {k: [reg(_Buf(size)) if k == "mooncake" else _Buf(size) for _ in range(count)] for k in IMPLS}
    src = {k: [reg(_Buf(size, 3)) if k == "mooncake" else _Buf(size, 3) for _ in range(count)] for k in IMPLS}

    def ptrs(k, d):
        return [b.ptr for b in d[k]]
    raw_read = lambda i: te.batch_transfer_sync_read(sess, ptrs("raw", dst), [c.base + o for o in offs],  # noqa: E731
                                                     [size] * count)
    raw_write = lambda i: te.batch_transfer_sync_write(sess, ptrs("raw", src), [c.base + o for o in offs],  # noqa: E731
                                                       [size] * count)
    sizes = [size] * count
    rows.append(("batch_get_into", count * size, _measure({
        "ours": lambda i: ours.batch_get_into(keys, ptrs("ours", dst), sizes),
        "mooncake": lambda i: ref.batch_get_into(keys, ptrs("mooncake", dst), sizes),
        "raw": raw_read, "local": lambda i: local.batch_get_into(keys, ptrs("local", dst), sizes)}, n)))
    rows.append(("batch_put_from", count * size, _measure({
        "ours": lambda i: ours.batch_put_from([f"bp-{i}-{j}" for j in range(count)], ptrs("ours", src), sizes),
        "mooncake": lambda i: ref.batch_put_from([f"bp-{i}-{j}" for j in range(count)], ptrs("mooncake", src),
                                                 sizes),
        "raw": raw_write,
        "local": lambda i: local.batch_put_from([f"bpl-{i}-{j}" for j in range(count)], ptrs("local", src),
                                                sizes)}, n)))
    # The read path's parts: one master lookup against one small TE read (what a
    # one-sided locate costs per probe window) of 512 bytes.
    probe = _Buf(512)
    lookup = _measure({"locate": lambda i: c.locate([c.stored("get-4096")]),
                       "te_512": lambda i: te.transfer_sync_read(sess, probe.ptr, c.base + off, 512)},
                      _iters(4 * KIB, quick))
    return rows, lookup


def _segment_rows(cfg, master):
    """get / get_into of values in this client's DRAM segment, in another
    client's (over TE) and in the pool, one reader, alternating."""
    from mooncake_cxl import MooncakeDistributedStore, ReplicateConfig
    os.environ["MC_CXL_DRAM_SEGMENT"] = "1"
    s = MooncakeDistributedStore()
    rc = s.setup(f"127.0.0.1:{common.free_port()}", "P2PHANDSHAKE", 256 * MIB, 0, "cxl", "", master.address)
    os.environ.pop("MC_CXL_DRAM_SEGMENT")
    if rc != 0:
        raise RuntimeError(f"setup with a DRAM segment failed: {rc}")
    near = ReplicateConfig()
    near.prefer_alloc_in_same_node = True
    rows = []
    owner = _segment_owner(master.address)
    try:
        for size in SIZES:
            n = _iters(size, cfg["quick"])
            v = common.value(size, 2)
            if s.put(f"seg-{size}", v, near) != 0 or s.put(f"pool-{size}", v) != 0:
                raise RuntimeError("segment bench: put failed")
            where = tuple(s.get_replica_desc(f"{k}-{size}")[0].read_by for k in ("seg", "peer", "pool"))
            if where != ("segment", "transfer_engine", "pool") or s.get(f"peer-{size}") != common.value(size, 3):
                raise RuntimeError(f"segment bench: values placed in {where}")
            dst = _Buf(size)
            s.register_buffer(dst.ptr, size)
            rows.append(("get", size, _measure({"segment": lambda i: s.get(f"seg-{size}"),
                                                "peer": lambda i: s.get(f"peer-{size}"),
                                                "pool": lambda i: s.get(f"pool-{size}")}, n)))
            rows.append(("get_into", size, _measure({
                "segment": lambda i: s.get_into(f"seg-{size}", dst.ptr, size),
                "peer": lambda i: s.get_into(f"peer-{size}", dst.ptr, size),
                "pool": lambda i: s.get_into(f"pool-{size}", dst.ptr, size)}, n)))
            s.unregister_buffer(dst.ptr)
    finally:
        owner.stdin.close()
        owner.wait(30)
        s.close()
    return rows


def _child(cfg):
    reference.bring_loopback_up()
    master = holder = ref_master = None
    # The pool (1 GiB), its secret and the reference master's log: removed
    # however the run ends.
    d = tempfile.mkdtemp(dir=cfg["pool_dir"], prefix="mcxl_bench_remote_")
    try:
        master, local, ours, ref, ref_master, holder = _stores(cfg, d)
        rows, lookup = _rows(cfg, local, ours, ref)
        segment = _segment_rows(cfg, master)
        result = {"rows": [{"op": op, "bytes": b, "us": us} for op, b, us in rows], "lookup": lookup,
                  "segment_rows": [{"op": op, "bytes": b, "us": us} for op, b, us in segment],
                  "machine_shared": True}
        print(_MARK + json.dumps(result), flush=True)
    finally:
        if holder is not None:
            holder.send_signal(signal.SIGTERM)
        if ref_master is not None:
            ref_master.stop()
        if master is not None:
            master.stop()
        shutil.rmtree(d, ignore_errors=True)
        sys.stdout.flush()
        os._exit(0)  # the engines' threads do not join cleanly


# ---------------------------------------------------------------- markdown

def markdown(r):
    if "skipped" in r:
        return f"Skipped: {r['skipped']}"
    lines = ["Median µs per call (GB/s for ≥ 1 MiB); ours = a remote client (values over TE-TCP from "
             "the pool's serving process), mooncake = Mooncake 0.3.13's store over TE-TCP (data in another "
             "client's segment), raw = TE's own transfer of the same bytes, local = a pool-mapped client. "
             "One run, the four alternating.", "",
             "| op | bytes | ours | mooncake | raw TE | local | ours/mooncake | raw/ours (throughput) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in r["rows"]:
        us, b = row["us"], row["bytes"]

        def cell(k):
            t = us[k]
            return f"{t:.0f}" + (f" ({b / t / 1e3:.2f} GB/s)" if b >= MIB else "")
        name = common.size_name(b) if row["op"] not in ("batch_get_into", "batch_put_from") else "32 × 64 KiB"
        lines.append(f"| {row['op']} | {name} | {cell('ours')} | {cell('mooncake')} | {cell('raw')} | "
                     f"{cell('local')} | {us['ours'] / us['mooncake']:.2f} | {us['raw'] / us['ours']:.2f} |")
    lk = r["lookup"]
    lines += ["", f"Read locate: one master lookup (kLocate over TCP) {lk['locate']:.0f} µs against one 512-byte "
              f"TE read {lk['te_512']:.0f} µs (what each probe window of a one-sided locate would cost)."]
    if r.get("segment_rows"):
        lines += ["", "DRAM segments: median µs per call (GB/s for ≥ 1 MiB) of one client reading values in its "
                  "own segment (MC_CXL_DRAM_SEGMENT=1, prefer_alloc_in_same_node), in another client process's "
                  "segment (over that owner's Transfer Engine, TCP) and in the pool, alternating.", "",
                  "| op | bytes | own segment | other's segment (TE) | pool | own/pool | other's/pool |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for row in r["segment_rows"]:
            us, b = row["us"], row["bytes"]
            cell = lambda t: f"{t:.0f}" + (f" ({b / t / 1e3:.2f} GB/s)" if b >= MIB else "")  # noqa: E731
            lines.append(f"| {row['op']} | {common.size_name(b)} | {cell(us['segment'])} | {cell(us['peer'])} | "
                         f"{cell(us['pool'])} | {us['segment'] / us['pool']:.2f} | {us['peer'] / us['pool']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(json.loads(sys.argv[2]))
    else:
        print(markdown(run(quick="--quick" in sys.argv)))
