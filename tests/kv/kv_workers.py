"""Spawned workers for tests/kv/test_kv.py: a prefill process that saves a
request's KV blocks and a decode process that finds and loads them. Block
contents are derived from (block hash, layer, K/V), so every process can check
every byte."""
import zlib

import numpy as np

from conftest import open_store
from mooncake_cxl.kv import BlockKVCache, KVLayout, Namespace

LAYOUT = dict(num_layers=4, block_tokens=8, num_kv_heads=2, head_dim=16, dtype="float16")


def make_cache(store, blocks_per_object, layer_groups, model="tiny", **ns):
    return BlockKVCache(store, KVLayout(**LAYOUT), Namespace(model, **ns), blocks_per_object=blocks_per_object,
                        layer_groups=layer_groups)


def tokens(seed, n):
    return np.random.default_rng(seed).integers(0, 50000, n)


def expected_half(layout, h, layer, kv, model="tiny"):
    """The bytes of one block's K or V in one layer: a function of its hash."""
    seed = int.from_bytes(h[:8], "little") ^ (layer * 2 + kv) ^ (zlib.crc32(model.encode()) << 8)
    rng = np.random.default_rng(seed)
    shape = (layout.block_tokens, layout.num_kv_heads, layout.head_dim)
    return rng.standard_normal(shape).astype(layout.np_dtype)


def fill_engine(cache, buffers, hashes, engine_blocks, model="tiny"):
    lay = cache.layout
    for h, b in zip(hashes, engine_blocks):
        for layer in range(lay.num_layers):
            for kv in (0, 1):
                half = expected_half(lay, h, layer, kv, model)
                if lay.order == "kv_first":
                    buffers[layer][kv, b] = half
                else:
                    buffers[layer][b, kv] = half


def check_engine(cache, buffers, hashes, engine_blocks, model="tiny"):
    """Number of (block, layer, K/V) halves whose bytes differ from the expected ones."""
    lay = cache.layout
    bad = 0
    for h, b in zip(hashes, engine_blocks):
        for layer in range(lay.num_layers):
            for kv in (0, 1):
                got = buffers[layer][kv, b] if lay.order == "kv_first" else buffers[layer][b, kv]
                bad += not np.array_equal(got.view(np.uint8), expected_half(lay, h, layer, kv, model).view(np.uint8))
    return bad


def prefill(conn, address, n_obj, groups, seed, n_tokens):
    """Saves one request (engine blocks scattered, in reverse order)."""
    store = open_store(address)
    cache = make_cache(store, n_obj, groups)
    hashes = cache.block_hashes(tokens(seed, n_tokens))
    buffers = cache.layout.allocate(64)
    engine_blocks = [63 - 2 * i for i in range(len(hashes))]
    cache.register(buffers)
    fill_engine(cache, buffers, hashes, engine_blocks)
    written = cache.save(hashes, engine_blocks)
    store.close()
    return {"blocks": len(hashes), "written": written}


def decode(conn, address, n_obj, groups, seed, n_tokens, shared_tokens):
    """A request whose first `shared_tokens` match the prefill's: finds the
    longest prefix, loads it into its own (differently placed) engine blocks,
    checks every byte, then checks the pinned views too."""
    store = open_store(address)
    cache = make_cache(store, n_obj, groups)
    t = tokens(seed, n_tokens)
    t[shared_tokens:] = tokens(seed + 1000, n_tokens)[shared_tokens:]
    hashes = cache.block_hashes(t)
    prefix = cache.lookup(hashes)
    buffers = cache.layout.allocate(64)
    engine_blocks = list(range(5, 5 + len(hashes)))
    cache.register(buffers)
    loaded = cache.load(prefix, engine_blocks)
    bad = check_engine(cache, buffers, hashes[:prefix.blocks], engine_blocks)
    untouched = all(not buffers[layer][:, engine_blocks[prefix.blocks:]].any()
                    for layer in range(cache.layout.num_layers))
    view_bad = 0
    lay = cache.layout
    for s, c, g, handle, arr in cache.views(prefix):
        for li, layer in enumerate(cache.groups[g]):
            for kv in (0, 1):
                for b in range(c):
                    view_bad += not np.array_equal(arr[li, kv, b], expected_half(lay, hashes[s + b], layer, kv))
    store.close()
    return {"prefix": prefix.blocks, "objects": len(prefix.objects), "loaded": loaded, "bad": bad,
            "untouched": untouched, "view_bad": view_bad}


# ---------------------------------------------------------------- announcements

def streaming_decode(conn, address, n_obj, seed, n_tokens, channel, ack_channel):
    """Started before the prefill: follows `channel`, loads each announced run
    as soon as it is announced, checks its bytes, acks it on `ack_channel`
    (so the prefill produces run k+1 only after run k was loaded here)."""
    from mooncake_cxl.kv import Announcer, Listener, request_key
    from mooncake_cxl.kv.announce import BLOCKS_READY, REQUEST_DONE
    store = open_store(address)
    cache = make_cache(store, n_obj, 1)
    hashes = cache.block_hashes(tokens(seed, n_tokens))
    buffers = cache.layout.allocate(64)
    engine_blocks = list(range(3, 3 + len(hashes)))
    cache.register(buffers)
    listener = Listener(store, channel)
    acks = Announcer(store, ack_channel)
    conn.send("listening")
    loaded, events, bad, done = 0, [], 0, False
    me = request_key("req-A")
    while not done:
        got = listener.wait(timeout=60)
        assert got, "no announcement within 60 s"
        for a in got:
            if a.request != me:
                continue
            if a.kind == BLOCKS_READY:
                prefix = cache.lookup(hashes[:a.end])
                assert prefix.blocks == a.end, (prefix.blocks, a.end)
                cache.load(prefix, engine_blocks, start=loaded)
                bad += check_engine(cache, buffers, hashes[loaded:a.end], engine_blocks[loaded:a.end])
                events.append((a.first, a.end))
                loaded = a.end
                acks.blocks_ready("req-A", a.first, a.end)
            elif a.kind == REQUEST_DONE:
                done = True
    acks.close()
    store.close()
    return {"loaded": loaded, "events": events, "bad": bad, "lost": listener.lost}


def streaming_prefill(conn, address, n_obj, seed, n_tokens, channel, ack_channel):
    """Produces a request run by run (a chunked prefill): fills the run's
    engine blocks, saves it, announces it, then waits for the decode's ack."""
    from mooncake_cxl.kv import Announcer, Listener
    store = open_store(address)
    cache = make_cache(store, n_obj, 1)
    hashes = cache.block_hashes(tokens(seed, n_tokens))
    buffers = cache.layout.allocate(64)
    engine_blocks = [40 - i for i in range(len(hashes))]
    cache.register(buffers)
    acks = Listener(store, ack_channel)
    ann = Announcer(store, channel)
    acked = []
    for first in range(0, len(hashes), n_obj):
        end = min(first + n_obj, len(hashes))
        fill_engine(cache, buffers, hashes[first:end], engine_blocks[first:end])
        cache.save(hashes[:end], engine_blocks[:end], start=first)
        ann.blocks_ready("req-A", first, end)
        ann.blocks_ready("req-other", 0, 1)  # noise the decode must ignore
        got = []
        while not got:
            got = acks.wait(timeout=60)
            assert got, "no ack within 60 s"
        acked += [(a.first, a.end) for a in got]
    ann.request_done("req-A", len(hashes))
    ann.close()
    store.close()
    return {"acked": acked}


def hold_channel(conn, address, channel):
    """Claims `channel` as its producer, publishes 3 records, then waits to be killed."""
    import time
    from mooncake_cxl.kv import Announcer
    store = open_store(address)
    ann = Announcer(store, channel)
    for i in range(3):
        ann.blocks_ready("held", i, i + 1)
    conn.send("holding")
    time.sleep(600)


def wait_one(conn, address, channel, timeout):
    """Waits (spin, then futex) for one announcement on `channel`."""
    from mooncake_cxl.kv import Listener
    store = open_store(address)
    listener = Listener(store, channel, from_start=False)
    conn.send("waiting")
    got = listener.wait(timeout=timeout, spin_us=10)
    store.close()
    return [(a.first, a.end) for a in got]
