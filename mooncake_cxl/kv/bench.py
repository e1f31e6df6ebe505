"""Aggregation benchmark: one object per run of blocks per layer group vs one
object per block per layer, same bytes, one process (save, then load into a
second set of engine buffers).

    python -m mooncake_cxl.kv.bench --master 127.0.0.1:50051 [--tokens 4096]
"""
import argparse
import time

import numpy as np

from .cache import BlockKVCache, KVLayout, Namespace


def measure_aggregation(store, layout, num_blocks, configs=((1, None), (16, 1)), repeats=3):
    """For each (blocks_per_object, layer_groups) (None: one group per layer),
    the best save and load time in seconds of a `num_blocks` request and the
    number of objects. Engine blocks are scattered (every other block), as a
    paged engine's usually are."""
    rng = np.random.default_rng(0)
    src = layout.allocate(2 * num_blocks)
    for a in src:
        a.reshape(-1).view(np.uint8)[:] = rng.integers(0, 256, a.nbytes, dtype=np.uint8)
    dst = layout.allocate(2 * num_blocks)
    engine_blocks = list(range(0, 2 * num_blocks, 2))
    tokens = rng.integers(0, 32000, num_blocks * layout.block_tokens)
    results = []
    for n, g in configs:
        g = layout.num_layers if g is None else g
        save_t, load_t, objects = [], [], 0
        for rep in range(repeats):
            cache = BlockKVCache(store, layout, Namespace("bench", salt=f"{n}-{g}-{rep}-{time.time_ns()}"),
                                 blocks_per_object=n, layer_groups=g)
            cache.register(src)
            hashes = cache.block_hashes(tokens)
            t0 = time.perf_counter()
            objects = cache.save(hashes, engine_blocks)
            save_t.append(time.perf_counter() - t0)
            cache.unregister()
            cache.register(dst)
            t0 = time.perf_counter()
            prefix = cache.lookup(hashes)
            cache.load(prefix, engine_blocks)
            load_t.append(time.perf_counter() - t0)
            assert prefix.blocks == num_blocks
            pick = (lambda a: a[:, engine_blocks]) if layout.order == "kv_first" else (lambda a: a[engine_blocks])
            assert all(np.array_equal(pick(s.view(np.uint8)), pick(d.view(np.uint8))) for s, d in zip(src, dst)), \
                "loaded bytes differ"
            for d in dst:
                d[...] = 0
            cache.remove(prefix, force=True)
            cache.unregister()
        results.append({"blocks_per_object": n, "layer_groups": g, "objects": objects,
                        "save_s": min(save_t), "load_s": min(load_t),
                        "bytes": num_blocks * layout.block_bytes})
    return results


def main(argv=None):
    from .. import MooncakeDistributedStore
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--master", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--block-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    layout = KVLayout(args.layers, args.block_tokens, 8, 64, "bfloat16")
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", args.master) == 0
    for r in measure_aggregation(s, layout, args.tokens // args.block_tokens):
        gib = r["bytes"] / 2**30
        print(f"N={r['blocks_per_object']:3d} groups={r['layer_groups']:3d} objects={r['objects']:6d} "
              f"save {r['save_s'] * 1e3:8.2f} ms ({gib / r['save_s']:6.2f} GiB/s)  "
              f"load {r['load_s'] * 1e3:8.2f} ms ({gib / r['load_s']:6.2f} GiB/s)")
    s.close()


if __name__ == "__main__":
    main()
