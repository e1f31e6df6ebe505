"""The engines section's worker: SGLang's and LMCache's own Mooncake backends,
timed in an interpreter that has them (engines.py starts one per store and
alternates them). Reads commands from stdin, one JSON object a line, and
answers each with one JSON line on stdout:

    {"op": "sglang", "page_bytes": N, "batch": 32, "iters": I}
        -> {"set_gbps", "get_gbps", "set_memcpy_gbps", "get_memcpy_gbps", "set_in_store",
            "get_in_store", "exact": bool}
           (a batch's bytes / its median time)
    {"op": "lmcache", "batch": B, "iters": I}
        -> {"put_gbps", "get_gbps", "put_memcpy_gbps", "get_memcpy_gbps", "put_in_store",
            "get_in_store", "exact": bool}

<op>_in_store: the share of the batch's time spent inside the store's own
calls (StoreClock); the rest is the engine's code around them.
<op>_memcpy_gbps: the bound of that row, timed after each batch: the same
parts copied by one memcpy each between the same caller memory the engine
handed the store (its source for a set/put, its destination for a get) and
the next bytes of a /dev/shm working set (the pool's medium, cycled as the
pool's fresh extents are), with no store in between.

argv: master address, "ours"|"reference". Every batch writes fresh keys (both
backends skip keys that exist) and reads them back into other host memory.
"""
import asyncio
import json
import os
import statistics
import sys
import time

import torch

LAYERS, HEADS = 4, 2
_sglang = {}
_memcpy = {}


def wait_for_pool_mapping():
    """With MCXL_BENCH_POOL=path:size (ours, prefault on): once, after the
    first store's setup, until this process has the whole pool mapped."""
    spec = os.environ.pop("MCXL_BENCH_POOL", None)
    if spec:
        from mooncake_cxl.bench import pages
        path, size = spec.rsplit(":", 1)
        pages.wait_resident(os.getpid(), path, int(size))


class StoreClock:
    """Stands in for the engine's store object and adds up the time spent
    inside its calls (the rest of a batch is the engine's own code)."""

    def __init__(self, store):
        self._store, self.spent = store, 0.0

    def __getattr__(self, name):
        f = getattr(self._store, name)
        if not callable(f):
            return f

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                self.spent += time.perf_counter() - t0
        return timed

    def take(self):
        spent, self.spent = self.spent, 0.0
        return spent


def memcpy_s(ptrs, sizes, to_pool):
    """One memcpy per part between caller memory and a /dev/shm working set
    of 256 MiB (into it for a set, out of it for a get): seconds."""
    if "bench" not in _memcpy:
        from mooncake_cxl.bench import common
        _memcpy["bench"] = common.memcpy_baseline(1 << 20, 256 << 20)
    return _memcpy["bench"].run_parts(ptrs, sizes, to_pool) / 1e9


def _sglang_store(master, page_bytes, batch):
    """SGLang's MooncakeStore over its MHA page_first host pool whose pages
    (K and V of every layer: two objects) are page_bytes long."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _mha_host_inputs
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore
    head_dim = 128
    page = page_bytes // (2 * LAYERS * HEADS * head_dim * 2)
    tokens = 2 * batch * page
    dev = MHATokenToKVPool(tokens, page, torch.float16, HEADS, head_dim, LAYERS, "cpu", False,
                           start_layer=0, end_layer=LAYERS - 1)
    host_cls, host_input, host_kwargs = _mha_host_inputs(dev)
    host = host_cls(host_input, **host_kwargs, host_to_device_ratio=1.0, host_size=0, page_size=page,
                    layout="page_first", pin_memory=False, allocator_type="default", pool_label="kv")
    raw = host.kv_buffer.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8))
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                               attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                               is_page_first_layout=True, model_name="bench",
                               extra_config={"master_server_address": master, "protocol": "tcp",
                                             "metadata_server": "P2PHANDSHAKE", "device_name": "",
                                             "global_segment_size": "1gb"})
    store = MooncakeStore(cfg, host)
    store.register_mem_pool_host(host)
    store.store = StoreClock(store.store)
    wait_for_pool_mapping()
    return store, host, page


def sglang(master, page_bytes, batch, iters, tag):
    key = (page_bytes, batch)
    if key not in _sglang:
        _sglang[key] = _sglang_store(master, page_bytes, batch)
    store, host, page = _sglang[key]
    src = torch.arange(0, batch * page)
    dst = torch.arange(batch * page, 2 * batch * page)
    probe = store._tag_keys([f"{tag}-parts-{j}" for j in range(batch)])  # the parts the store is handed
    _, src_ptrs, sizes = store._batch_preprocess(probe, src)
    _, dst_ptrs, _ = store._batch_preprocess(probe, dst)
    t_set, t_get, t_set_copy, t_get_copy, in_set, in_get = [], [], [], [], [], []
    exact = True
    for i in range(iters):
        keys = [f"{tag}-{page_bytes}-{i}-{j}" for j in range(batch)]
        store.store.take()
        t0 = time.perf_counter()
        ok_set = store.batch_set_v1(keys, src)
        t1 = time.perf_counter()
        in_set.append(store.store.take())
        t1b = time.perf_counter()
        ok_get = store.batch_get_v1(keys, dst)
        t2 = time.perf_counter()
        in_get.append(store.store.take())
        t_set.append(t1 - t0)
        t_get.append(t2 - t1)
        bits = host.kv_buffer.view(torch.int16)  # bitwise: random halves hold NaNs
        exact &= all(ok_set) and all(ok_get) and torch.equal(bits[:, :batch * page],
                                                             bits[:, batch * page:2 * batch * page])
        # The bounds after the check: the get's copy overwrites dst.
        t_set_copy.append(memcpy_s(src_ptrs, sizes, True))
        t_get_copy.append(memcpy_s(dst_ptrs, sizes, False))
    moved = batch * page_bytes / 1e9
    assert sum(sizes) == batch * page_bytes
    return {"set_gbps": moved / statistics.median(t_set), "get_gbps": moved / statistics.median(t_get),
            "set_memcpy_gbps": moved / statistics.median(t_set_copy),
            "get_memcpy_gbps": moved / statistics.median(t_get_copy),
            "set_in_store": statistics.median(a / b for a, b in zip(in_set, t_set)),
            "get_in_store": statistics.median(a / b for a, b in zip(in_get, t_get)), "exact": bool(exact)}


_lm = {}


def lmcache(master, batch, iters, tag):
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.connector import CreateConnector
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    if not _lm:
        ref = sys.argv[2] == "reference"
        extra = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "protocol": "tcp",
                 "device_name": "", "global_segment_size": str(1 << 30),
                 "local_buffer_size": str(256 << 20), "save_chunk_meta": False,
                 ("mooncake_master_server_addr" if ref else "master_server_address"): master}
        config = LMCacheEngineConfig.from_defaults(chunk_size=256, local_cpu=False, max_local_cpu_size=0.5,
                                                   remote_url=f"mooncakestore://{master}",
                                                   remote_serde="naive", extra_config=extra)
        metadata = LMCacheMetadata(model_name="bench", world_size=1, local_world_size=1, worker_id=0,
                                   local_worker_id=0, kv_dtype=torch.bfloat16,
                                   kv_shape=(LAYERS, 2, 256, HEADS, 64))
        loop = asyncio.new_event_loop()
        backend = LocalCPUBackend(config, metadata)
        _lm.update(loop=loop, backend=backend, metadata=metadata,
                   connector=CreateConnector(config.remote_url, loop, backend, config, metadata))
        inner = getattr(_lm["connector"], "_connector", _lm["connector"])  # under LMCache's instrumented wrapper
        inner.store = _lm["clock"] = StoreClock(inner.store)
        wait_for_pool_mapping()
    loop, backend, connector, clock = _lm["loop"], _lm["backend"], _lm["connector"], _lm["clock"]
    shape = _lm["metadata"].get_shapes()[0]
    values = [torch.randint(0, 256, (2 * shape.numel(),), dtype=torch.uint8) for _ in range(batch)]
    chunk = values[0].numel()
    t_put, t_get, t_put_copy, t_get_copy, in_put, in_get = [], [], [], [], [], []
    exact = True
    for i in range(iters):
        keys = [CacheEngineKey("bench", 1, 0, hash((tag, i, j)) & (2**62 - 1), torch.bfloat16) for j in range(batch)]
        objs = [backend.allocate(shape, torch.bfloat16, MemoryFormat.KV_2LTD) for _ in range(batch)]
        for o, v in zip(objs, values):
            o.tensor.view(torch.uint8).view(-1).copy_(v)
        put_ptrs = [o.tensor.data_ptr() for o in objs]  # the put releases the objects' tensors
        clock.take()
        t0 = time.perf_counter()
        loop.run_until_complete(connector.batched_put(keys, objs))
        t1 = time.perf_counter()
        in_put.append(clock.take())
        t1b = time.perf_counter()
        got = loop.run_until_complete(connector.batched_get(keys))
        t2 = time.perf_counter()
        in_get.append(clock.take())
        t_put.append(t1 - t0)
        t_get.append(t2 - t1b)
        exact &= all(g is not None and torch.equal(g.tensor.view(torch.uint8).reshape(-1), v)
                     for g, v in zip(got, values))
        if exact:  # the bound: the same chunks out of the put's and into the get's memory objects
            t_put_copy.append(memcpy_s(put_ptrs, [chunk] * batch, True))  # LMCache's buffer: still mapped
            t_get_copy.append(memcpy_s([g.tensor.data_ptr() for g in got], [chunk] * batch, False))
        for o in objs + [g for g in got if g is not None]:
            o.ref_count_down()
    moved = batch * chunk / 1e9
    return {"put_gbps": moved / statistics.median(t_put), "get_gbps": moved / statistics.median(t_get),
            "put_memcpy_gbps": moved / statistics.median(t_put_copy) if exact else 0.0,
            "get_memcpy_gbps": moved / statistics.median(t_get_copy) if exact else 0.0,
            "put_in_store": statistics.median(a / b for a, b in zip(in_put, t_put)),
            "get_in_store": statistics.median(a / b for a, b in zip(in_get, t_get)),
            "exact": bool(exact), "chunk_bytes": chunk}


def main():
    master = sys.argv[1]
    import mooncake.store
    impl = "ours" if getattr(mooncake.store, "__mooncake_cxl_shim__", False) else "reference"
    assert impl == sys.argv[2], f"asked for {sys.argv[2]}, `mooncake.store` is {impl}"
    print(json.dumps({"ready": impl}), flush=True)
    n = 0
    for line in sys.stdin:
        cmd = json.loads(line)
        n += 1
        tag = f"{impl}{n}"
        if cmd["op"] == "sglang":
            r = sglang(master, cmd["page_bytes"], cmd["batch"], cmd["iters"], tag)
        else:
            r = lmcache(master, cmd["batch"], cmd["iters"], tag)
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
