"""PD hand-off: the KV cache of one long request from a prefill process to a
decode process (python -m mooncake_cxl.bench --only pd).

The request: 30,720 tokens in Llama-3.2-1B's KV shape (16 layers x 8 KV heads
x 64 dims x K,V x bf16 = 32 KiB per token, 0.94 GiB), in the prefill's engine
buffers (one array per layer, vLLM's [2, blocks, 16 tokens, heads, dim]).
Timed from the moment the prefill holds the KV (t0) to the moment the decode
can use it, on one clock (CLOCK_MONOTONIC) across the two processes:

  ours (copy)    prefill: BlockKVCache.save one layer group at a time (runs of
                 64 blocks per object and layer, held until consumed) and announces each
                 layer through a channel in the pool; decode: receive(), which
                 waits on the channel (spin, then futex) and loads each layer
                 into its own buffers as it is announced. No TCP between them.
  ours (views)   the same, the decode takes pinned views (get_buffer) instead
                 of copying: first view, and every view.
  Mooncake TCP   Mooncake 0.3.13's store (the reference wheel, protocol tcp,
                 the prefill's segment holds the objects): batch_put_from of
                 per-layer objects from a registered buffer, a notification
                 over a TCP socket, batch_get_into into the decode's
                 registered buffer.
  raw TCP        the same bytes over one socket on 127.0.0.1 (sendall /
                 recv_into): what any network hand-off costs at least here.

Each run starts fresh processes (and frees their buffers after); the methods
take turns, round by round, in alternating order; medians are reported.
A last row is the aggregation measure of mooncake_cxl.kv.bench (one process,
runs of 16 blocks per object vs one object per block per layer).
"""
import multiprocessing as mp
import os
import socket
import statistics
import struct
import time

from . import common, reference

LAYOUT = dict(num_layers=16, block_tokens=16, num_kv_heads=8, head_dim=64, dtype="bfloat16")
TOKENS, QUICK_TOKENS = 30720, 4096
ROUNDS, QUICK_ROUNDS = 3, 1
METHODS = ("ours", "ours_views", "mooncake", "tcp")
NAMES = {"ours": "ours: announce + load into the decode buffer", "ours_views": "ours: announce + pinned views",
         "mooncake": "Mooncake 0.3.13 store, TCP (put, notify, get)", "tcp": "raw TCP socket, 127.0.0.1"}
HOLD_S = 120.0
# Runs of 64 blocks (1,024 tokens) per layer: 480 objects of 2 MiB at 30k
# tokens, so the views fit one client's 1,024 pin records.
BLOCKS_PER_OBJECT = 64
MOONCAKE_OBJECTS_PER_LAYER = 8  # 7.5 MiB objects at 30k tokens
SPAWN = mp.get_context("spawn")


def _now():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def _shape(tokens):
    L = LAYOUT
    return (L["num_layers"], 2, tokens // L["block_tokens"], L["block_tokens"], L["num_kv_heads"], L["head_dim"])


def _buffer(tokens, fill):
    """One allocation for every layer (uint16 = bf16 bytes), pages touched."""
    import numpy as np
    a = np.empty(_shape(tokens), dtype=np.uint16)
    w = a.reshape(-1).view(np.uint64)
    if fill:
        w[:] = np.arange(w.size, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    else:
        w[:] = 0
    return a


def _check(a):
    """Sampled check of the pattern _buffer(fill=True) writes: True if intact."""
    import numpy as np
    w = a.reshape(-1).view(np.uint64)
    idx = np.arange(0, w.size, 4093, dtype=np.uint64)
    idx = np.append(idx, np.uint64(w.size - 1))
    return bool(np.array_equal(w[idx.astype(np.int64)], idx * np.uint64(0x9E3779B97F4A7C15)))


def _cache(store, tokens, salt):
    import numpy as np
    from ..kv import BlockKVCache, KVLayout, Namespace
    lay = KVLayout(**LAYOUT)
    cache = BlockKVCache(store, lay, Namespace("bench-pd", salt=salt), blocks_per_object=BLOCKS_PER_OBJECT,
                         layer_groups=lay.num_layers)
    hashes = cache.block_hashes(np.arange(tokens, dtype=np.int64) * 7 + 11)
    return cache, hashes


def _entry(target, conn, args):
    try:
        conn.send(("ok", target(conn, *args)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        import traceback
        conn.send(("err", f"{e!r}\n{traceback.format_exc()}"))


# ---------------------------------------------------------------- ours

def _ours_producer(conn, address, tokens, salt):
    os.environ.setdefault("MC_CXL_PREFAULT", "1")
    from ..kv import Announcer
    store = common.connect(address)
    cache, hashes = _cache(store, tokens, salt)
    buf = _buffer(tokens, True)
    cache.register([buf[i] for i in range(buf.shape[0])])
    blocks = list(range(len(hashes)))
    ann = Announcer(store, f"pd-{salt}")
    conn.send("ready")
    conn.recv()  # go
    t0 = _now()
    for g in range(cache.layer_groups):
        cache.save(hashes, blocks, groups=[g], hold=HOLD_S)
        ann.blocks_ready("req", 0, len(hashes), layer=g)
    t_saved = _now()
    ann.request_done("req", len(hashes))
    conn.send({"t0": t0, "t_saved": t_saved})
    conn.recv()  # the decode is done: clean up
    cache.remove(cache.stored_prefix(hashes), force=True)
    ann.close()
    cache.unregister()
    store.close()
    return None


def _ours_consumer(conn, address, tokens, salt, views):
    os.environ.setdefault("MC_CXL_PREFAULT", "1")
    import numpy as np
    from ..kv import Listener, receive
    from ..kv.announce import BLOCKS_READY
    store = common.connect(address)
    cache, hashes = _cache(store, tokens, salt)
    lis = Listener(store, f"pd-{salt}", from_start=False)
    out = {}
    if not views:
        buf = _buffer(tokens, False)
        cache.register([buf[i] for i in range(buf.shape[0])])
        conn.send("ready")
        loaded = receive(cache, lis, "req", hashes, list(range(len(hashes))), timeout=600, idle_timeout=120)
        out["t_end"] = _now()
        out["ok"] = loaded == len(hashes) and _check(buf)
        cache.unregister()
    else:
        conn.send("ready")
        handles, first = [], None
        prefix = cache.stored_prefix(hashes)
        for a in lis.follow("req", timeout=600, idle_timeout=120):
            if a.kind != BLOCKS_READY:
                continue  # REQUEST_DONE: every layer was announced
            for g in ([a.layer] if a.layer < cache.layer_groups else range(cache.layer_groups)):
                for s, c, stem in prefix.objects:
                    h = store.get_buffer(cache._key(stem, g))
                    if h is None:
                        raise RuntimeError(f"no view of layer {g} run {s}")
                    handles.append((g, s, c, h))
                if first is None:
                    first = _now()
        out["t_end"] = _now()
        out["t_first"] = first
        # Sampled check: each view is [1 layer, K/V, c blocks, ...] of the layout.
        ref = _buffer(tokens, True)
        ok = True
        for g, s, c, h in handles[::97] + handles[-1:]:
            v = np.frombuffer(h, dtype=np.uint16).reshape(2, c, *ref.shape[3:])
            ok = ok and np.array_equal(v, ref[g, :, s:s + c])
        out["ok"] = ok and len(handles) == len(prefix.objects) * cache.layer_groups
        del handles
    store.close()
    return out


# ---------------------------------------------------------------- Mooncake

def _mooncake_store(address, segment):
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup(f"127.0.0.1:{common.free_port()}", "P2PHANDSHAKE", segment, 64 << 20, "tcp", "", address)
    if rc != 0:
        raise RuntimeError(f"Mooncake setup returned {rc}")
    return s


def _mooncake_objects(buf, salt):
    """Keys, pointers and sizes: MOONCAKE_OBJECTS_PER_LAYER pieces of each layer."""
    base, per_layer = buf.ctypes.data, buf[0].nbytes
    k = MOONCAKE_OBJECTS_PER_LAYER
    piece = per_layer // k
    keys, ptrs, sizes = [], [], []
    for layer in range(buf.shape[0]):
        for j in range(k):
            off = layer * per_layer + j * piece
            n = piece if j < k - 1 else per_layer - j * piece
            keys.append(f"pd-{salt}/l{layer}/{j}")
            ptrs.append(base + off)
            sizes.append(n)
    return keys, ptrs, sizes


def _mooncake_producer(conn, address, tokens, salt, notify_port):
    buf = _buffer(tokens, True)
    store = _mooncake_store(address, buf.nbytes + (256 << 20))
    if store.register_buffer(buf.ctypes.data, buf.nbytes) != 0:
        raise RuntimeError("Mooncake register_buffer failed")
    keys, ptrs, sizes = _mooncake_objects(buf, salt)
    conn.send("ready")
    conn.recv()
    t0 = _now()
    rc = store.batch_put_from(keys, ptrs, sizes)
    t_saved = _now()
    if any(r != 0 for r in rc):
        raise RuntimeError(f"Mooncake batch_put_from: {sorted(set(rc))}")
    with socket.create_connection(("127.0.0.1", notify_port)) as s:  # "the request's KV is stored"
        s.sendall(b"k")
    conn.send({"t0": t0, "t_saved": t_saved})
    conn.recv()
    store.remove_all()
    store.unregister_buffer(buf.ctypes.data)
    store.close()
    return None


def _mooncake_consumer(conn, address, tokens, salt):
    buf = _buffer(tokens, False)
    store = _mooncake_store(address, 0)
    if store.register_buffer(buf.ctypes.data, buf.nbytes) != 0:
        raise RuntimeError("Mooncake register_buffer failed")
    keys, ptrs, sizes = _mooncake_objects(buf, salt)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    conn.send(("ready", srv.getsockname()[1]))
    c, _ = srv.accept()
    c.recv(1)
    rc = store.batch_get_into(keys, ptrs, sizes)
    t_end = _now()
    c.close()
    srv.close()
    ok = all(r == n for r, n in zip(rc, sizes)) and _check(buf)
    store.unregister_buffer(buf.ctypes.data)
    store.close()
    return {"t_end": t_end, "ok": ok, "rc": sorted(set(rc))[:4]}


# ---------------------------------------------------------------- raw TCP

def _tcp_producer(conn, tokens, port):
    buf = _buffer(tokens, True)
    conn.send("ready")
    conn.recv()
    t0 = _now()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(struct.pack("<Q", buf.nbytes))
        s.sendall(memoryview(buf).cast("B"))
    t_saved = _now()
    conn.send({"t0": t0, "t_saved": t_saved})
    conn.recv()
    return None


def _tcp_consumer(conn, tokens):
    buf = _buffer(tokens, False)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    conn.send(("ready", srv.getsockname()[1]))
    c, _ = srv.accept()
    head = b""
    while len(head) < 8:
        head += c.recv(8 - len(head))
    n = struct.unpack("<Q", head)[0]
    mv = memoryview(buf).cast("B")
    got = 0
    while got < n:
        r = c.recv_into(mv[got:], n - got)
        if r == 0:
            break
        got += r
    t_end = _now()
    c.close()
    srv.close()
    return {"t_end": t_end, "ok": got == n == buf.nbytes and _check(buf)}


# ---------------------------------------------------------------- driver

class _Proc:
    def __init__(self, target, *args):
        self.conn, child = SPAWN.Pipe()
        self.proc = SPAWN.Process(target=_entry, args=(target, child, args), daemon=True)
        self.proc.start()
        child.close()

    def recv(self, timeout=900):
        if not self.conn.poll(timeout):
            raise RuntimeError(f"benchmark process {self.proc.pid} sent nothing in {timeout} s")
        msg = self.conn.recv()
        if isinstance(msg, tuple) and msg and msg[0] == "err":
            raise RuntimeError(f"benchmark process failed: {msg[1]}")
        return msg

    def result(self):
        while True:
            msg = self.recv()
            if isinstance(msg, tuple) and msg[0] == "ok":
                self.proc.join(60)
                return msg[1]

    def stop(self):
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)


def _one(method, tokens, ours_address, mooncake_address, salt):
    procs = []
    try:
        if method in ("ours", "ours_views"):
            cons = _Proc(_ours_consumer, ours_address, tokens, salt, method == "ours_views")
            procs.append(cons)
            assert cons.recv() == "ready"
            prod = _Proc(_ours_producer, ours_address, tokens, salt)
        elif method == "mooncake":
            cons = _Proc(_mooncake_consumer, mooncake_address, tokens, salt)
            procs.append(cons)
            _, port = cons.recv()
            prod = _Proc(_mooncake_producer, mooncake_address, tokens, salt, port)
        else:
            cons = _Proc(_tcp_consumer, tokens)
            procs.append(cons)
            _, port = cons.recv()
            prod = _Proc(_tcp_producer, tokens, port)
        procs.append(prod)
        assert prod.recv() == "ready"
        prod.conn.send("go")
        p = prod.recv()
        c = cons.result()
        prod.conn.send("done")
        prod.result()
    finally:
        for x in procs:
            x.stop()
    if not c.get("ok"):
        raise RuntimeError(f"{method}: the decode's bytes differ from the prefill's ({c})")
    r = {"handoff_s": (c["t_end"] - p["t0"]) / 1e9, "produce_s": (p["t_saved"] - p["t0"]) / 1e9,
         "tail_s": max(0, c["t_end"] - p["t_saved"]) / 1e9}
    if c.get("t_first") is not None:
        r["first_view_s"] = (c["t_first"] - p["t0"]) / 1e9
    return r


def _mooncake_available():
    return reference.loopback_only() and reference.reference_master_binary() is not None


def run(quick=False, pool_dir="/dev/shm", tokens=None, rounds=None, methods=METHODS, aggregation=True):
    from ..launch import MasterProcess
    tokens = tokens or (QUICK_TOKENS if quick else TOKENS)
    rounds = rounds or (QUICK_ROUNDS if quick else ROUNDS)
    payload = tokens * 2 * LAYOUT["num_layers"] * LAYOUT["num_kv_heads"] * LAYOUT["head_dim"] * 2
    methods = list(methods)
    notes = []
    if "mooncake" in methods and not _mooncake_available():
        methods.remove("mooncake")
        notes.append("Mooncake row skipped: needs the reference wheel (the oracle extra) and a loopback-only "
                     "network namespace (python -m mooncake_cxl.bench --only pd re-runs itself under "
                     "`unshare -n`)")
    samples = {m: [] for m in methods}
    pool_size = ((payload * 2 + (256 << 20)) >> 20) << 20
    log_dir = os.path.join(pool_dir if os.path.isdir(pool_dir) else "/tmp", "")
    agg, page = None, None
    with common.temp_pool("mcxl_bench_pd", pool_dir) as path:
        ours = MasterProcess(path, pool_size, format=True, extra_flags=["--prefault_pool"],
                             log_path=os.path.join("/tmp", f"mcxl_pd_master_{os.getpid()}.log")).start()
        theirs = None
        try:
            if "mooncake" in methods:
                theirs = reference.ReferenceMaster(os.path.join("/tmp", f"mcxl_pd_mooncake_{os.getpid()}.log"))
                theirs.start()
            for rnd in range(rounds):
                order = methods if rnd % 2 == 0 else methods[::-1]
                for m in order:
                    salt = f"{m}-{rnd}-{os.getpid()}"
                    samples[m].append(_one(m, tokens, ours.address, theirs.address if theirs else None, salt))
            if aggregation:
                agg, page = _aggregation(ours.address, tokens, quick, path)
        finally:
            if theirs is not None:
                theirs.stop()
            ours.stop()
    del log_dir
    med = {m: {k: statistics.median(s[k] for s in samples[m]) for k in samples[m][0]} for m in methods}
    return {"tokens": tokens, "bytes": payload, "rounds": rounds, "samples": samples, "median": med,
            "aggregation": agg, "page": page, "notes": notes, "machine": common.machine()}


def _aggregation_worker(conn, address, tokens, quick, pool):
    from ..kv import KVLayout
    from ..kv.bench import measure_aggregation
    os.environ.setdefault("MC_CXL_PREFAULT", "1")
    store = common.connect(address)
    lay = KVLayout(**LAYOUT)
    res = measure_aggregation(store, lay, tokens // lay.block_tokens, configs=((1, None), (16, 1)),
                              repeats=1 if quick else 2)
    from . import pages
    page = pages.page_size(os.getpid(), pool)  # the page size these copies ran on
    store.close()
    return res, page


def _aggregation(address, tokens, quick, pool):
    p = _Proc(_aggregation_worker, address, tokens, quick, pool)
    try:
        return p.result()
    finally:
        p.stop()


def markdown(res):
    gib = res["bytes"] / 2**30
    med = res["median"]
    lines = [f"KV of a {res['tokens']:,}-token request, Llama-3.2-1B shape (32 KiB/token, {gib:.2f} GiB), "
             f"prefill process -> decode process; median of {res['rounds']} alternating run(s). "
             "hand-off: from the prefill holding the KV to the decode able to use it; produce: the prefill's "
             "part (save + announce / put / send); tail: what the decode waits after that. "
             f"Our pool's page size: {res.get('page') or 'not measured (no aggregation run)'}.", "",
             "| method | hand-off ms | GiB/s | produce ms | tail ms | first view ms | vs Mooncake |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    base = med.get("mooncake", {}).get("handoff_s")
    for m in METHODS:
        if m not in med:
            continue
        r = med[m]
        vs = f"{100 * (1 - r['handoff_s'] / base):.1f}% lower" if base and m != "mooncake" else ("1.00" if base else "")
        fv = f"{r['first_view_s'] * 1e3:.1f}" if "first_view_s" in r else ""
        lines.append(f"| {NAMES[m]} | {r['handoff_s'] * 1e3:.1f} | {gib / r['handoff_s']:.2f} | "
                     f"{r['produce_s'] * 1e3:.1f} | {r['tail_s'] * 1e3:.1f} | {fv} | {vs} |")
    if "ours_views" in med and base:
        lines.append(f"| ours: to the first usable pinned view | {med['ours_views']['first_view_s'] * 1e3:.1f} | | | | | "
                     f"{100 * (1 - med['ours_views']['first_view_s'] / base):.1f}% lower |")
    if "ours" in med and base:
        lines.append(f"| ours: exposed after the prefill's last layer (layer-wise save overlapping the prefill) | "
                     f"{med['ours']['tail_s'] * 1e3:.1f} | | | | | {100 * (1 - med['ours']['tail_s'] / base):.1f}% lower |")
    if res.get("aggregation"):
        lines += ["", "Aggregation (one process, same bytes, engine blocks scattered; save then load into "
                  f"other buffers; pool page {res.get('page') or '?'}):", "", "| objects | format | save ms | load ms | load GiB/s |",
                  "|---:|---|---:|---:|---:|"]
        for a in res["aggregation"]:
            fmt = ("one object per block per layer" if a["blocks_per_object"] == 1
                   else f"runs of {a['blocks_per_object']} blocks, {a['layer_groups']} layer group(s)")
            lines.append(f"| {a['objects']:,} | {fmt} | {a['save_s'] * 1e3:.1f} | {a['load_s'] * 1e3:.1f} | "
                         f"{a['bytes'] / 2**30 / a['load_s']:.2f} |")
    for n in res.get("notes", []):
        lines += ["", f"Note: {n}"]
    return "\n".join(lines)
