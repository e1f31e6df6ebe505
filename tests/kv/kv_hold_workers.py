"""Spawned workers for tests/kv/test_kv_hold.py and tests/kv/test_kv_handoff.py:
a prefill that saves (holding) and announces a request, a decode that
receives it, a filler that floods the pool, a write-back decode and a
checker. Block bytes are a function of (hash, layer, K/V) (kv_workers), so
every process checks every byte."""
import time

import kv_workers as W
from conftest import open_store
from mooncake_cxl.kv import Announcer, BlockKVCache, KVLayout, Listener, Namespace, RequestIncomplete, receive

# 64 KiB per block: a 32-block request is 2 MiB of a 64 MiB test pool.
LAYOUT = dict(num_layers=4, block_tokens=16, num_kv_heads=4, head_dim=64, dtype="float16")


def make_cache(store, n_obj=4, groups=1):
    return BlockKVCache(store, KVLayout(**LAYOUT), Namespace("hold-test"), blocks_per_object=n_obj,
                        layer_groups=groups)


def request(cache, seed, n_blocks, extra=0):
    return W.tokens(seed, n_blocks * cache.layout.block_tokens + extra)


def prefill(conn, address, seed, n_blocks, hold_s, channel=None, announce_runs=None, then="exit"):
    """Saves request `seed` run by run with a hold of hold_s seconds (None: no
    hold), announcing each run on `channel`. With announce_runs=k it stops
    after k runs and then: "exit" (closing nothing: the process just ends),
    "sleep" (alive and silent), "abort" (request_aborted). Otherwise it ends
    with request_done."""
    store = open_store(address)
    cache = make_cache(store)
    hashes = cache.block_hashes(request(cache, seed, n_blocks, extra=3))
    buffers = cache.layout.allocate(2 * n_blocks + 2)
    blocks = [2 * n_blocks - i for i in range(n_blocks)]
    cache.register(buffers)
    W.fill_engine(cache, buffers, hashes, blocks, model="hold")
    ann = Announcer(store, channel) if channel else None
    N = cache.blocks_per_object
    runs = [(s, min(s + N, n_blocks)) for s in range(0, n_blocks, N)]
    for k, (first, end) in enumerate(runs):
        if announce_runs is not None and k == announce_runs:
            conn.send(("stopped", first))
            if then == "sleep":
                time.sleep(600)
            elif then == "abort":
                ann.request_aborted(f"req-{seed}")
                conn.send("aborted")
                time.sleep(600)
            return None
        cache.save(hashes[:end], blocks[:end], start=first, hold=hold_s)
        if ann:
            ann.blocks_ready(f"req-{seed}", first, end)
    if ann:
        ann.request_done(f"req-{seed}", n_blocks)
    store.close()  # the hold outlives the producer
    return {"blocks": n_blocks}


def decode(conn, address, seed, n_blocks, channel, timeout=60.0, idle_timeout=None, release=True):
    """Receives request `seed` from `channel` into its own engine blocks and
    checks every byte loaded; reports a RequestIncomplete instead of raising."""
    store = open_store(address)
    cache = make_cache(store)
    hashes = cache.block_hashes(request(cache, seed, n_blocks, extra=3))
    buffers = cache.layout.allocate(n_blocks + 4)
    blocks = list(range(3, 3 + n_blocks))
    cache.register(buffers)
    lis = Listener(store, channel)
    conn.send("listening")
    out = {}
    t0 = time.monotonic()
    try:
        out["loaded"] = receive(cache, lis, f"req-{seed}", hashes, blocks, timeout=timeout,
                                idle_timeout=idle_timeout, release=release)
    except RequestIncomplete as e:
        out.update(error=str(e), reason=e.reason, code=int(e.code), blocks=e.blocks, loaded=e.loaded)
    out["seconds"] = time.monotonic() - t0
    out["bad"] = W.check_engine(cache, buffers, hashes[:out["loaded"]], blocks[:out["loaded"]], model="hold")
    store.close()
    return out


def flood(conn, address, prefix, total_bytes, size=1 << 20):
    """Puts total_bytes of new objects (eviction must make room); returns
    (puts ok, puts refused)."""
    store = open_store(address)
    ok = bad = 0
    payload = bytes(size)
    for i in range(total_bytes // size):
        if store.put(f"{prefix}/{i}", payload) == 0:
            ok += 1
        else:
            bad += 1
    store.close()
    return ok, bad


def present(conn, address, seed, n_blocks):
    """How many of request `seed`'s objects are in the store (is_exist: the
    read lease it grants is the master's short ttl here)."""
    store = open_store(address)
    cache = make_cache(store)
    hashes = cache.block_hashes(request(cache, seed, n_blocks, extra=3))
    keys = cache._prefix_keys(cache.stored_prefix(hashes))
    n = sum(1 for r in store.batch_is_exist(keys) if r == 1)
    store.close()
    return n, len(keys)


def write_back(conn, address, seed, n_blocks, new_tokens):
    """A decode: loads the prefill's blocks (lookup), 'generates' new_tokens
    more tokens, fills its new blocks and writes them back (chain continued
    from the last prefill block). Returns how many blocks it loaded and saved."""
    store = open_store(address)
    cache = make_cache(store)
    bt = cache.layout.block_tokens
    prompt = request(cache, seed, n_blocks, extra=3)
    hashes = cache.block_hashes(prompt)
    prefix = cache.lookup(hashes)
    buffers = cache.layout.allocate(64)
    blocks = list(range(7, 7 + 40))
    cache.register(buffers)
    loaded = cache.load(prefix, blocks)
    bad = W.check_engine(cache, buffers, hashes[:loaded], blocks[:loaded], model="hold")
    generated = W.tokens(seed + 500, new_tokens)
    full = list(prompt) + list(generated)
    # The chain continues from the last full prefill block: same keys as hashing all tokens.
    new = cache.block_hashes(full[loaded * bt:], parent=hashes[loaded - 1])
    all_hashes = hashes[:loaded] + new
    assert all_hashes == cache.block_hashes(full)
    W.fill_engine(cache, buffers, new, blocks[loaded:len(all_hashes)], model="hold")
    written = cache.save(all_hashes, blocks, start=loaded)
    store.close()
    return {"loaded": loaded, "bad": bad, "saved_blocks": len(new), "written": written}


def third(conn, address, seed, n_blocks, new_tokens):
    """Another request with the same prompt and continuation: one prefix."""
    store = open_store(address)
    cache = make_cache(store)
    full = list(request(cache, seed, n_blocks, extra=3)) + list(W.tokens(seed + 500, new_tokens))
    hashes = cache.block_hashes(full)
    prefix = cache.lookup(hashes)
    buffers = cache.layout.allocate(64)
    blocks = list(range(60, 60 - 40, -1))
    cache.register(buffers)
    loaded = cache.load(prefix, blocks)
    bad = W.check_engine(cache, buffers, hashes[:loaded], blocks[:loaded], model="hold")
    store.close()
    return {"blocks": len(hashes), "prefix": prefix.blocks, "loaded": loaded, "bad": bad,
            "objects": [(s, c) for s, c, _ in prefix.objects]}
