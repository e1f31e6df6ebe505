"""LMCache 0.5.6's `mooncakestore://` connector through LMCache's own
CreateConnector and LocalCPUBackend, run as a script by the engines interpreter:

    python lmcache_workers.py spec.json out.json

spec: {"mode": "write"|"read", "master": "host:port", "seed": int, "chunks": int}.
For each save_chunk_meta mode (False: batch_put_from/batch_get_into; True:
put_parts/batch_get_buffer) "write" puts `chunks` 256-token KV chunks of
seeded bytes with batched_put (then reads them back); "read" (a fresh process)
checks they exist and gets them with batched_get. out.json records per mode
whether every chunk came back byte-exact.

With "engine_tokens": n, it then runs LMCacheEngine itself over a CPU KV tensor
(CPUKVConnector: LMCache ships no CPU connector): "write" store()s an n-token
prompt's KV; "read" lookup()s and retrieve()s it into zeros.
"""
import asyncio
import json
import sys

import torch

CHUNK, LAYERS, HEADS, HEAD_DIM = 256, 4, 2, 64
KV_SHAPE = (LAYERS, 2, CHUNK, HEADS, HEAD_DIM)  # LMCacheMetadata's; a chunk is 256 KiB at bfloat16
MODEL = "org/model"


def chunk_bytes(seed, i):
    g = torch.Generator().manual_seed(seed * 1000 + i)
    return torch.randint(0, 256, (LAYERS * 2 * CHUNK * HEADS * HEAD_DIM * 2,), dtype=torch.uint8, generator=g)


def build(spec, save_chunk_meta):
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.connector import CreateConnector
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    extra = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "protocol": "tcp",
             "device_name": "", "master_server_address": spec["master"],
             "global_segment_size": str(256 << 20), "local_buffer_size": str(64 << 20),
             "save_chunk_meta": save_chunk_meta}
    if spec.get("reference"):
        # Mooncake reads master_server_addr only; LMCache forwards mooncake_-prefixed keys stripped.
        extra["mooncake_master_server_addr"] = extra.pop("master_server_address")
    config = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK, local_cpu=False, max_local_cpu_size=0.1,
                                               remote_url=f"mooncakestore://{spec['master']}",
                                               remote_serde="naive", extra_config=extra)
    metadata = LMCacheMetadata(model_name=MODEL, world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=KV_SHAPE)
    loop = asyncio.new_event_loop()
    backend = LocalCPUBackend(config, metadata)
    connector = CreateConnector(config.remote_url, loop, backend, config, metadata)
    return loop, backend, connector, metadata


def key(i, seed):
    from lmcache.utils import CacheEngineKey
    return CacheEngineKey(MODEL, 1, 0, seed * 1000 + i, torch.bfloat16)


def run_mode(spec, save_chunk_meta):
    from lmcache.v1.memory_management import MemoryFormat
    loop, backend, connector, metadata = build(spec, save_chunk_meta)
    n, seed = spec["chunks"], spec["seed"] + int(save_chunk_meta)
    keys = [key(i, seed) for i in range(n)]
    out = {}
    if spec["mode"] == "write":
        shape = metadata.get_shapes()[0]
        objs = []
        for i in range(n):
            obj = backend.allocate(shape, torch.bfloat16, MemoryFormat.KV_2LTD)
            obj.tensor.view(torch.uint8).view(-1).copy_(chunk_bytes(seed, i))
            objs.append(obj)
        loop.run_until_complete(connector.batched_put(keys, objs))
        for o in objs:
            o.ref_count_down()
    out["exists"] = [int(connector.exists_sync(k)) for k in keys]
    got = loop.run_until_complete(connector.batched_get(keys))
    out["exact"] = [g is not None and torch.equal(g.tensor.view(torch.uint8).reshape(-1), chunk_bytes(seed, i))
                    for i, g in enumerate(got)]
    loop.run_until_complete(connector.close())
    return out


def cpu_kv_connector(kv):
    from lmcache.v1.gpu_connector.mock_gpu_connector import MockGPUConnector

    class CPUKVConnector(MockGPUConnector):
        """The serving engine's KV: one CPU tensor [2, layers, tokens, heads * head_dim]."""

        def from_gpu(self, memory_obj, start, end, **kwargs):
            memory_obj.tensor.copy_(kv[:, :, start:end])

        def to_gpu(self, memory_obj, start, end, **kwargs):
            kv[:, :, start:end].copy_(memory_obj.tensor)

        def batched_from_gpu(self, memory_objs, starts, ends, **kwargs):
            for o, s, e in zip(memory_objs, starts, ends):
                self.from_gpu(o, s, e)

        def batched_to_gpu(self, memory_objs, starts=None, ends=None, **kwargs):
            if starts is None:
                raise NotImplementedError("layer-wise retrieval")
            for o, s, e in zip(memory_objs, starts, ends):
                self.to_gpu(o, s, e)

    return CPUKVConnector(KV_SHAPE)


def run_engine(spec):
    import time
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    extra = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "protocol": "tcp",
             "device_name": "", "master_server_address": spec["master"],
             "global_segment_size": str(256 << 20), "local_buffer_size": str(64 << 20),
             "save_chunk_meta": False}
    config = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK, local_cpu=False, max_local_cpu_size=0.1,
                                               remote_url=f"mooncakestore://{spec['master']}",
                                               remote_serde="naive", extra_config=extra)
    metadata = LMCacheMetadata(model_name=MODEL, world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=KV_SHAPE)
    n = spec["engine_tokens"]
    g = torch.Generator().manual_seed(spec["seed"])
    tokens = torch.randint(0, 30000, (n,), generator=g)
    prompt_kv = torch.randint(0, 256, (2, LAYERS, n, HEADS * HEAD_DIM * 2), dtype=torch.uint8,
                              generator=g).view(torch.bfloat16)
    kv = prompt_kv.clone() if spec["mode"] == "write" else torch.zeros_like(prompt_kv)
    engine = LMCacheEngineBuilder.get_or_create("engines-test", config, metadata, cpu_kv_connector(kv),
                                                lambda t, r: None, lambda o, r: o)
    engine.post_init()
    full = n // CHUNK * CHUNK
    out = {}
    if spec["mode"] == "write":
        engine.store(tokens)
        deadline = time.monotonic() + 60  # a hang guard: the remote put ends on LMCache's thread
        while engine.lookup(tokens) < full and time.monotonic() < deadline:
            time.sleep(0.02)
        out["lookup"] = engine.lookup(tokens)
    else:
        out["lookup"] = engine.lookup(tokens)
        got = int(engine.retrieve(tokens).sum())
        out["retrieved"] = got
        out["exact"] = torch.equal(kv[:, :, :got].view(torch.uint8), prompt_kv[:, :, :got].view(torch.uint8))
        out["rest_untouched"] = bool((kv[:, :, got:].view(torch.uint8) == 0).all())
    LMCacheEngineBuilder.destroy("engines-test")
    return out


def main():
    spec = json.load(open(sys.argv[1]))
    import mooncake.store
    out = {"impl": "ours" if getattr(mooncake.store, "__mooncake_cxl_shim__", False) else "reference"}
    for save_chunk_meta in spec.get("modes", [False, True]):
        out["put_parts" if save_chunk_meta else "batch_put_from"] = run_mode(spec, save_chunk_meta)
    if spec.get("engine_tokens"):
        out["engine"] = run_engine(spec)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
