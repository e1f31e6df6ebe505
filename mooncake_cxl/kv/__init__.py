"""mooncake_cxl.kv: engine KV-cache blocks as objects in the pool.

    from mooncake_cxl.kv import BlockKVCache, KVLayout, Namespace
    layout = KVLayout(num_layers=16, block_tokens=16, num_kv_heads=8, head_dim=64, dtype="bfloat16")
    cache = BlockKVCache(store, layout, Namespace("llama-3.2-1b", tp_rank=0, tp_size=1),
                         blocks_per_object=16)
    cache.register(layer_buffers)              # the engine's per-layer KV arrays
    hashes = cache.block_hashes(token_ids)     # chained: prefix semantics
    cache.save(hashes, engine_block_ids)       # prefill: one copy out of the engine
    prefix = cache.lookup(hashes)              # decode: longest cached prefix, one call
    cache.load(prefix, engine_block_ids)       # one copy into the engine (or cache.views(prefix))

    Announcer(store, "prefill-0").blocks_ready("req-1", 0, 16)   # prefill -> decode, through the pool
    Listener(store, "prefill-0").wait(timeout=5.0)               # spin, then futex
    cache.save(hashes, blocks, hold=30.0)      # hold until consumed (or 30 s)
    receive(cache, Listener(store, "prefill-0"), "req-1", hashes, blocks, idle_timeout=5)
                                               # load as announced; RequestIncomplete if the producer dies

Built on the public store API only (batch_is_exist, batch_put_from_multi_buffers,
batch_get_into_multi_buffers, get_into_ranges, get_buffer); nothing outside this
package depends on it except mooncake_cxl.vllm. See cache.py for the contract
(key format, aggregation into runs of blocks per layer group).
"""
from .announce import ALL_LAYERS, Announcement, Announcer, Listener, RequestIncomplete, receive, request_key
from .cache import BlockKVCache, KVCacheError, KVLayout, Namespace, Prefix

__all__ = ["BlockKVCache", "KVCacheError", "KVLayout", "Namespace", "Prefix",
           "Announcer", "Listener", "Announcement", "ALL_LAYERS", "request_key", "RequestIncomplete", "receive"]
