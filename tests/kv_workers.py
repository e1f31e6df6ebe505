"""Spawned workers for tests/test_kv.py: a prefill process that saves a
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
