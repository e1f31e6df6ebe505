"""Against Mooncake: python -m mooncake_cxl.bench --compare mooncake [--quick] [--out DIR] [--report [PATH]]
[--no-progress] [--no-reexec].

The same workloads run against both stores in one run:

  writer process   put, put_from (registered buffer), batch_put_from, put_tensor
  reader process   get, get_into, batch_get_into (registered buffers), is_exist,
                   get_tensor, batch_get_tensor_into (registered buffers)
                   of the values (and tensors) the writer left in the store

(the tensor rows only when torch is installed: pip install '.[torch]'; a
tensor of N bytes is a uint8 tensor, stored as Mooncake's 304-byte header
plus the N bytes)

for values of 4 KiB, 64 KiB, 1 MiB and 16 MiB. Each store has its own writer
and reader process (four processes, set up once) and its own master: ours over
a pool in /dev/shm, Mooncake's `mooncake_master` from the reference wheel
(mooncake-transfer-engine-non-cuda, the `oracle` extra). For every size the
stores take turns, round by round, in alternating order (ours first in even
rounds, Mooncake first in odd ones), so that drift of the machine hits both
alike. Each store is set up as its users set it up: ours maps the pool
(protocol "cxl"); Mooncake's writer mounts a segment and its reader fetches
over TCP on loopback (protocol "tcp", P2PHANDSHAKE), as two hosts would.

Latency is per call through the Python API (perf_counter_ns), median and p99;
throughput is value bytes / median latency. The output is a markdown table
(ours ÷ Mooncake: below 1 means ours is faster), a JSON file and a PNG chart,
in --out (default ~/.cache/mooncake_cxl/bench), and with --report the table
in the performance document (report.py).

Network: Mooncake's client listens on 0.0.0.0 whatever it is told, so this
benchmark runs inside a private network namespace with only loopback. When it
is not already in one, it re-executes itself under `unshare -n` (needs root
or user namespaces, and util-linux's unshare) and brings `lo` up itself.
--no-reexec refuses instead.
"""
import importlib.util
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback

from .. import extras
from . import common, reference, report
from .common import KIB, MIB

SIZES = [4 * KIB, 64 * KIB, 1 * MIB, 16 * MIB]
STORES = ["mooncake_cxl", "mooncake"]
TENSOR_OPS = ["put_tensor", "get_tensor", "batch_get_tensor_into"] \
    if importlib.util.find_spec("torch") is not None else []
OPS = ["put", "put_from", "batch_put_from", "get", "get_into", "batch_get_into", "is_exist"] + TENSOR_OPS
BATCH_OPS = ("batch_put_from", "batch_get_into", "batch_get_tensor_into")
TENSOR_HEADER = 304  # Mooncake's tensor object header
READ_SET_BYTES = 64 * MIB  # the values the writer leaves for the reader, per size

# size: (timed single calls, timed batches) per round. From 1 MiB up at least
# 50 batches and 100 calls per round (200 / 400 samples): with fewer, "p99"
# is the sample maximum, i.e. one preemption on a shared machine.
PLAN = {4 * KIB: (1500, 150), 64 * KIB: (800, 80), 1 * MIB: (300, 50), 16 * MIB: (100, 50)}
ROUNDS = 4
QUICK_PLAN = {4 * KIB: (30, 4), 64 * KIB: (20, 3), 1 * MIB: (8, 2), 16 * MIB: (3, 1)}
QUICK_ROUNDS = 1

REFERENCE_SEGMENT = 256 * MIB  # Mooncake writer's segment: the read set plus one batch in flight
REFERENCE_LOCAL_BUFFER = 64 * MIB  # put()/get() stage values here; 16 MiB values must fit
_NETNS_ENV = "MCXL_COMPARE_NETNS"
_PROG = "mooncake_cxl.bench --compare"


def batch_size(size):
    """Values per batch call: 32 small ones, fewer big ones (at least 2)."""
    return max(2, min(32, (16 * MIB) // size))


def read_set_len(size):
    return max(batch_size(size), min(64, READ_SET_BYTES // size))


# ---------------------------------------------------------------- workers

def _connect(store_kind, role, address):
    if store_kind == "mooncake_cxl":
        # The pool's pages are mapped after setup (prefault, the default), as
        # the data bench and a deployment over /dev/shm do: otherwise the first put into
        # each fresh page pays a first-touch fault (~4 µs/page here: ~16 ms
        # for the first 16 MiB), which in 24-96 samples per row is the p99.
        os.environ["MC_CXL_PREFAULT"] = "1"
        from mooncake_cxl import MooncakeDistributedStore
        s = MooncakeDistributedStore()
        rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address)
    else:
        from mooncake.store import MooncakeDistributedStore
        s = MooncakeDistributedStore()
        segment = REFERENCE_SEGMENT if role == "writer" else 0  # the reader only reads
        rc = s.setup(f"127.0.0.1:{common.free_port()}", "P2PHANDSHAKE", segment, REFERENCE_LOCAL_BUFFER, "tcp", "",
                     address)
    if rc != 0:
        raise RuntimeError(f"{store_kind} {role}: setup failed with {rc}")
    return s


def _timed(fn, n, check):
    lat = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        r = fn(i)
        lat.append(time.perf_counter_ns() - t0)
        check(r, i)
    return lat


def _expect(op, want):
    def check(r, i):
        if r != want:
            raise RuntimeError(f"{op} returned {r!r}, expected {want!r}")
    return check


def _write(s, size, tag, n, nbatch):
    import numpy as np
    nread, b = read_set_len(size), batch_size(size)
    for i in range(nread):  # the reader's values (untimed)
        rc = s.put(f"{tag}/r/{i}", common.value(size, i))
        if rc != 0:
            raise RuntimeError(f"put of the read set failed: {rc}")
    value = common.value(size, 7)
    out = {}
    # Every timed put writes a new key, removed right after (untimed), so the
    # working set stays the read set plus one batch.
    put_ok, removed = _expect("put", 0), _expect("remove", 0)

    def check_and_remove(key):
        def check(r, i):
            put_ok(r, i)
            removed(s.remove(key(i), True), i)
        return check
    out["put"] = _timed(lambda i: s.put(f"{tag}/p/{i}", value), n, check_and_remove(lambda i: f"{tag}/p/{i}"))
    bufs = np.frombuffer(bytearray(b * size), dtype=np.uint8)
    bufs[:] = 3
    base = bufs.ctypes.data
    if s.register_buffer(base, bufs.nbytes) != 0:
        raise RuntimeError("register_buffer failed")
    try:
        out["put_from"] = _timed(lambda i: s.put_from(f"{tag}/f/{i}", base, size), n,
                                 check_and_remove(lambda i: f"{tag}/f/{i}"))
        ptrs, sizes = [base + j * size for j in range(b)], [size] * b
        batch_ok = _expect("batch_put_from", [0] * b)

        def check_batch(r, i):
            batch_ok(r, i)
            if s.batch_remove([f"{tag}/b/{i}/{j}" for j in range(b)], True) != [0] * b:
                raise RuntimeError("batch_remove failed")
        out["batch_put_from"] = _timed(
            lambda i: s.batch_put_from([f"{tag}/b/{i}/{j}" for j in range(b)], ptrs, sizes), nbatch, check_batch)
    finally:
        s.unregister_buffer(base)
    if TENSOR_OPS:
        import torch
        for i in range(nread):  # the reader's tensors (untimed)
            rc = s.put_tensor(f"{tag}/t/{i}", torch.frombuffer(bytearray(common.value(size, i)), dtype=torch.uint8))
            if rc != 0:
                raise RuntimeError(f"put_tensor of the read set failed: {rc}")
        t = torch.frombuffer(bytearray(value), dtype=torch.uint8)
        out["put_tensor"] = _timed(lambda i: s.put_tensor(f"{tag}/pt/{i}", t), n,
                                   check_and_remove(lambda i: f"{tag}/pt/{i}"))
    return out


def _read(s, size, tag, n, nbatch):
    import numpy as np
    nread, b = read_set_len(size), batch_size(size)
    keys = [f"{tag}/r/{i}" for i in range(nread)]
    if s.get(keys[1]) != common.value(size, 1):
        raise RuntimeError(f"wrong bytes read back for {keys[1]}")
    out = {}

    def check_len(r, i):
        if len(r) != size:
            raise RuntimeError(f"get returned {len(r)} bytes, expected {size}")
    out["get"] = _timed(lambda i: s.get(keys[i % nread]), n, check_len)
    bufs = np.zeros(b * size, dtype=np.uint8)
    base = bufs.ctypes.data
    if s.register_buffer(base, bufs.nbytes) != 0:
        raise RuntimeError("register_buffer failed")
    try:
        out["get_into"] = _timed(lambda i: s.get_into(keys[i % nread], base, size), n, _expect("get_into", size))
        if bytes(bufs[:size]) != common.value(size, (n - 1) % nread):
            raise RuntimeError("get_into wrote the wrong bytes")
        ptrs, sizes = [base + j * size for j in range(b)], [size] * b
        out["batch_get_into"] = _timed(
            lambda i: s.batch_get_into([keys[(i * b + j) % nread] for j in range(b)], ptrs, sizes), nbatch,
            _expect("batch_get_into", sizes))
    finally:
        s.unregister_buffer(base)
    out["is_exist"] = _timed(lambda i: s.is_exist(keys[i % nread]), n, _expect("is_exist", 1))
    if TENSOR_OPS:
        tkeys = [f"{tag}/t/{i}" for i in range(nread)]

        def check_tensor(r, i):
            if r is None or r.numel() != size:
                raise RuntimeError(f"get_tensor returned {r!r:.80}, expected {size} elements")
        out["get_tensor"] = _timed(lambda i: s.get_tensor(tkeys[i % nread]), n, check_tensor)
        stride = size + TENSOR_HEADER
        tbufs = np.zeros(b * stride, dtype=np.uint8)
        tbase = tbufs.ctypes.data
        if s.register_buffer(tbase, tbufs.nbytes) != 0:
            raise RuntimeError("register_buffer failed")
        try:
            tptrs, tsizes = [tbase + j * stride for j in range(b)], [stride] * b

            def check_tensors(r, i):
                if len(r) != b or any(x is None or isinstance(x, int) or x.numel() != size for x in r):
                    raise RuntimeError(f"batch_get_tensor_into returned {r!r:.120}")
            out["batch_get_tensor_into"] = _timed(
                lambda i: s.batch_get_tensor_into([tkeys[(i * b + j) % nread] for j in range(b)], tptrs, tsizes),
                nbatch, check_tensors)
        finally:
            s.unregister_buffer(tbase)
    return out


def _worker(store_kind, role, address, conn, log_path):
    """One client process: set up once, then serve commands until "stop"."""
    s = None
    if store_kind == "mooncake":  # glog's INFO lines go to a file, not the terminal
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    try:
        s = _connect(store_kind, role, address)
        conn.send(("ready", None))
        while True:
            cmd, args = conn.recv()
            if cmd == "stop":
                break
            try:
                if cmd == "write":
                    conn.send(("ok", _write(s, *args)))
                elif cmd == "read":
                    conn.send(("ok", _read(s, *args)))
                elif cmd == "clean":
                    size, tag = args
                    s.batch_remove([f"{tag}/{kind}/{i}" for kind in ("r", "t") for i in range(read_set_len(size))],
                                   True)
                    conn.send(("ok", None))
            except Exception:
                conn.send(("error", traceback.format_exc()))
    except Exception:
        conn.send(("error", traceback.format_exc()))
    finally:
        if s is not None:
            s.close()
        conn.close()


class _Worker:
    def __init__(self, ctx, store_kind, role, address, log_path):
        self.name = f"{store_kind} {role}"
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(store_kind, role, address, child, log_path), daemon=True)
        self.proc.start()
        child.close()

    def wait(self, timeout=600):
        if not self.conn.poll(timeout):
            raise RuntimeError(f"{self.name}: no answer in {timeout} s")
        kind, payload = self.conn.recv()
        if kind == "error":
            raise RuntimeError(f"{self.name} failed:\n{payload}")
        return payload

    def call(self, cmd, *args):
        self.conn.send((cmd, args))
        return self.wait()

    def stop(self):
        if self.proc.is_alive():
            try:
                self.conn.send(("stop", None))
            except (BrokenPipeError, OSError):
                pass

    def join(self, timeout=60):
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


# ---------------------------------------------------------------- the run

def _measure(ctx, addresses, plan, rounds, samples, progress, log_dir):
    """The four client processes, driven size by size, round by round; they
    are closed before the masters stop (a Mooncake client whose master is
    gone takes many seconds to close)."""
    workers = {}
    bar = None
    try:
        for st in STORES:
            for role in ("writer", "reader"):
                workers[st, role] = _Worker(ctx, st, role, addresses[st], os.path.join(log_dir, f"{st}_{role}.log"))
        for w in workers.values():
            w.wait(120)
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=len(SIZES) * rounds * len(STORES), desc="compare", unit="run",
                       file=sys.stderr, dynamic_ncols=True)
        for size in SIZES:
            n, nbatch = plan[size]
            for r in range(rounds):
                order = STORES if r % 2 == 0 else STORES[::-1]
                for st in order:
                    if bar:
                        bar.set_postfix_str(f"{common.size_name(size)} {st}")
                    tag = f"cmp/{size}/{r}"
                    wrote = workers[st, "writer"].call("write", size, tag, n, nbatch)
                    read = workers[st, "reader"].call("read", size, tag, n, nbatch)
                    workers[st, "writer"].call("clean", size, tag)
                    for op, lat in {**wrote, **read}.items():
                        samples[st, op, size].extend(lat)
                    if bar:
                        bar.update(1)
    finally:
        if bar:
            bar.close()
        for w in workers.values():
            w.stop()
        for w in workers.values():
            w.join()


def run(quick=False, pool_dir="/dev/shm", log_dir=None, progress=True):
    """Both stores, every size and op; returns the result dict (see main)."""
    from ..launch import MasterProcess
    plan, rounds = (QUICK_PLAN, QUICK_ROUNDS) if quick else (PLAN, ROUNDS)
    log_dir = log_dir or tempfile.mkdtemp(prefix="mcxl_compare_")
    pool_size = 1024 * MIB
    samples = {(st, op, size): [] for st in STORES for op in OPS for size in SIZES}
    ctx = mp.get_context("spawn")
    with common.temp_pool("mcxl_compare", pool_dir) as pool, \
            MasterProcess(pool, pool_size, format=True, extra_flags=["--prefault_pool"],
                          log_path=os.path.join(log_dir, "ours_master.log")) as ours, \
            reference.ReferenceMaster(os.path.join(log_dir, "mooncake_master.log")) as theirs:
        addresses = {"mooncake_cxl": ours.address, "mooncake": theirs.address}
        _measure(ctx, addresses, plan, rounds, samples, progress, log_dir)
    rows = []
    for op in OPS:
        for size in SIZES:
            row = {"op": op, "size": size, "bytes_per_call": size * (batch_size(size) if op in BATCH_OPS else 1)}
            if op in BATCH_OPS:
                row["batch"] = batch_size(size)
            for st in STORES:
                med, p99 = common.percentiles(samples[st, op, size])
                row[st] = {"median_us": med, "p99_us": p99, "samples": len(samples[st, op, size]),
                           "gbps": row["bytes_per_call"] / (med * 1e3)}
            row["ratio_median"] = row["mooncake_cxl"]["median_us"] / row["mooncake"]["median_us"]
            row["ratio_p99"] = row["mooncake_cxl"]["p99_us"] / row["mooncake"]["p99_us"]
            rows.append(row)
    return {"machine": common.machine(), "quick": quick, "rounds": rounds,
            "plan": {str(k): v for k, v in plan.items()}, "sizes": SIZES, "ops": OPS,
            "setup": {"mooncake_cxl": ("protocol cxl, pool in /dev/shm, 1 GiB, prefaulted (master "
                                       "--prefault_pool, clients MC_CXL_PREFAULT=1)"),
                      "mooncake": (f"mooncake-transfer-engine-non-cuda, protocol tcp over loopback, "
                                   f"writer segment {REFERENCE_SEGMENT // MIB} MiB, local buffer "
                                   f"{REFERENCE_LOCAL_BUFFER // MIB} MiB, reader segment 0")},
            "rows": rows}


def markdown(result):
    lines = [f"Per call through the Python API; writer and reader in different processes; {result['rounds']} "
             "round(s) per size, stores alternating. ours ÷ Mooncake below 1 means ours is faster. "
             "GB/s = bytes per call / median.", "",
             "| op | size | ours median µs | ours p99 µs | Mooncake median µs | Mooncake p99 µs | "
             "ours ÷ Mooncake (median) | ours ÷ Mooncake (p99) | ours GB/s | Mooncake GB/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        o, m = r["mooncake_cxl"], r["mooncake"]
        size = common.size_name(r["size"]) + (f" ×{r['batch']}" if "batch" in r else "")
        moves = r["op"] != "is_exist"
        g = (lambda x: f"{x['gbps']:.2f}") if moves else (lambda x: "—")
        lines.append(f"| {r['op']} | {size} | {o['median_us']:.1f} | {o['p99_us']:.1f} | {m['median_us']:.1f} | "
                     f"{m['p99_us']:.1f} | {r['ratio_median']:.3f} | {r['ratio_p99']:.3f} | {g(o)} | {g(m)} |")
    st = result.get("setup")
    if st:
        lines += ["", f"Setup: ours: {st['mooncake_cxl']}; Mooncake: {st['mooncake']}."]
    return "\n".join(lines)


def chart(result, path):
    """Latency and throughput by value size, log-log; colour = op, line = store."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    fig, (lat_ax, bw_ax) = plt.subplots(1, 2, figsize=(13, 6))
    colors = plt.get_cmap("tab10")
    styles = {"mooncake_cxl": ("-", "o", "ours (mooncake_cxl)"), "mooncake": ("--", "s", "Mooncake 0.3.13")}
    for i, op in enumerate(result["ops"]):
        rows = [r for r in result["rows"] if r["op"] == op]
        sizes = [r["size"] for r in rows]
        for st, (ls, marker, _) in styles.items():
            lat_ax.plot(sizes, [r[st]["median_us"] for r in rows], ls, marker=marker, color=colors(i))
            if op != "is_exist":
                bw_ax.plot(sizes, [r[st]["gbps"] for r in rows], ls, marker=marker, color=colors(i))
    for ax, title, ylabel in ((lat_ax, "Latency per call (median)", "µs"),
                              (bw_ax, "Throughput (bytes per call / median)", "GB/s")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(result["sizes"], [common.size_name(s) for s in result["sizes"]])
        ax.set_xlabel("value size (batch ops move batch × size per call)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    handles = [Line2D([], [], color=colors(i), lw=3, label=op) for i, op in enumerate(result["ops"])]
    handles += [Line2D([], [], color="black", ls=ls, marker=marker, label=label)
                for ls, marker, label in styles.values()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle(f"mooncake_cxl vs Mooncake, {result['rounds']} round(s) per size; {result['machine']}",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def require_extras(progress=True):
    """Raises MissingExtra unless the reference wheel and the compare extra
    (matplotlib for the chart; tqdm for the progress bar) are installed."""
    extras.require("--compare mooncake", "oracle")
    extras.require("--compare mooncake", "compare", ("matplotlib", "tqdm") if progress else ("matplotlib",))
    extras.require("--compare mooncake", "bench")


def main(out, quick=False, progress=True, reexec=True, argv=(), report_path=None):
    """The --compare run of python -m mooncake_cxl.bench: compare.{md,json,png}
    into `out`, and with report_path its tables into that performance document
    (report.py). `argv` is that command's own arguments, to run it again under
    `unshare -n` when this process is not in a loopback-only namespace.
    Returns the exit status."""
    if not reference.loopback_only():
        if not reexec or os.environ.get(_NETNS_ENV) == "1":
            sys.exit(f"{_PROG}: not in a loopback-only network namespace (Mooncake's client binds "
                     "0.0.0.0); run it under `unshare -n` or without --no-reexec")
        why = reference.netns_unavailable()
        if why:
            sys.exit(f"{_PROG}: Mooncake's client binds 0.0.0.0, so it must run in a private network "
                     f"namespace, and {why}")
        return reference.rerun_in_netns(list(argv), _NETNS_ENV)
    reference.bring_loopback_up()  # a fresh `unshare -n` namespace has lo down
    try:
        import mooncake.store  # noqa: F401
    except ImportError as e:
        sys.exit(f"{_PROG}: the reference store is not importable ({e}); "
                 f"{extras.install_hint('oracle')} (needs Debian's libibverbs1)")

    os.makedirs(out, exist_ok=True)
    pool_dir = "/dev/shm" if os.path.isdir("/dev/shm") else common.default_pool_dir()
    t0 = time.monotonic()
    result = run(quick=quick, pool_dir=pool_dir, log_dir=tempfile.mkdtemp(prefix="mcxl_compare_logs_"),
                 progress=progress)
    result["wall_seconds"] = round(time.monotonic() - t0, 1)
    paths = {ext: os.path.join(out, f"compare.{ext}") for ext in ("md", "json", "png")}
    table = markdown(result)
    text = f"Machine: {result['machine']}\n\n{table}"
    with open(paths["md"], "w") as f:
        f.write(text + "\n")
    with open(paths["json"], "w") as f:
        json.dump(result, f, indent=1)
    chart(result, paths["png"])
    print(text)
    print()
    print(f"wrote {paths['md']}, {paths['json']}, {paths['png']} ({result['wall_seconds']} s)")
    if report_path:
        report.update(report_path, {"compare": table}, report.run_context(argv, pool_dir))
        print(f"wrote the compare section of {report_path}")
    return 0
