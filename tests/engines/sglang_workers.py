"""SGLang's HiCache Mooncake backend (its MooncakeStore with its CPU device and
host KV pools), run as a script by the engines interpreter:

    python sglang_workers.py spec.json out.json

spec: {"mode": "write"|"read", "master": "host:port", "seed": int, "cases":
[[name, mla, layout, route], ...]}; route is how SGLang finds the store's
config: "extra" (extra_config), "file" (SGLANG_HICACHE_MOONCAKE_CONFIG_PATH),
"env" (MOONCAKE_* variables) or "standalone" (standalone_storage: setup_dummy
through spec["standalone"], host pool from MooncakeHostMemAllocator). Each case builds
a device pool and SGLang's host pool for it, fills the host pool with seeded
bytes and, in "write", stores PAGES pages with batch_set_v1 and reads them back
into other pages; in "read" (a fresh process) it finds them, reads them with
batch_get_v1. out.json records
per case whether the pages came back byte-exact.
"""
import json
import os
import sys

import torch

PAGE, LAYERS, HEADS, HEAD_DIM, TOKENS = 16, 4, 2, 32, 512
PAGES = 8


def build_pools(mla, layout, allocator_type="default"):
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _mha_host_inputs
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    if mla:
        dev = MLATokenToKVPool(TOKENS, PAGE, torch.bfloat16, 64, 16, LAYERS, "cpu", False,
                               start_layer=0, end_layer=LAYERS - 1)
    else:
        dev = MHATokenToKVPool(TOKENS, PAGE, torch.float16, HEADS, HEAD_DIM, LAYERS, "cpu", False,
                               start_layer=0, end_layer=LAYERS - 1)
    # As SGLang's _build_mha_mla_host_pool, without pinned memory (a CUDA call).
    kwargs = dict(host_to_device_ratio=2.0, host_size=0, page_size=PAGE, layout=layout,
                  pin_memory=False, allocator_type=allocator_type, pool_label="kv")
    if mla:
        host = MLATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info,
                                    device_capacity_tokens=dev.size, start_layer=dev.start_layer,
                                    end_layer=dev.end_layer, target_layer_num=dev.layer_num,
                                    override_kv_cache_dim=dev.kv_cache_dim, **kwargs)
    else:
        host_cls, host_input, host_kwargs = _mha_host_inputs(dev)
        host = host_cls(host_input, **host_kwargs, **kwargs)
    return dev, host


def storage_config(mla, route, master, standalone=None):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    extra = None
    if route == "standalone":  # attach through the per-host standalone client (setup_dummy)
        extra = {"standalone_storage": True, "client_server_address": standalone, "protocol": "tcp",
                 "metadata_server": "P2PHANDSHAKE", "device_name": ""}
    if route == "extra":
        extra = {"master_server_address": master, "protocol": "tcp", "global_segment_size": "1gb",
                 "metadata_server": "P2PHANDSHAKE", "device_name": ""}
    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
                                is_page_first_layout=True, model_name="org/model", extra_config=extra)


def page_bytes(host, token_index):
    return host.get_data_page(token_index, flat=True).contiguous().view(torch.uint8)


def use_route(route, master, config_path):
    """Point SGLang's config loading at `route` for the next MooncakeStore."""
    os.environ.pop("SGLANG_HICACHE_MOONCAKE_CONFIG_PATH", None)
    for k in ("MOONCAKE_MASTER", "MOONCAKE_PROTOCOL", "MOONCAKE_TE_META_DATA_SERVER", "MOONCAKE_DEVICE"):
        os.environ.pop(k, None)
    if route == "env":
        os.environ.update({"MOONCAKE_MASTER": master, "MOONCAKE_PROTOCOL": "tcp",
                           "MOONCAKE_TE_META_DATA_SERVER": "P2PHANDSHAKE", "MOONCAKE_DEVICE": ""})
    elif route == "file":
        with open(config_path, "w") as f:
            json.dump({"master_server_address": master, "protocol": "tcp",
                       "metadata_server": "P2PHANDSHAKE", "global_segment_size": "1gb"}, f)
        os.environ["SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"] = config_path


def legacy_api(store, host, name):
    """The older zero-copy calls (set/get, batch_set/batch_get) on two pages' K halves."""
    src = [host.get_data_page(i * PAGE, flat=False) for i in (0, 1)]
    dst = [host.get_data_page((2 * PAGES + i) * PAGE, flat=False) for i in (0, 1)]
    half = src[0][0].numel() * src[0].element_size()  # the K half of a page_first page is contiguous
    for d in dst:
        d.zero_()
    ok = store.set(f"{name}-legacy-0", target_location=src[0][0].data_ptr(), target_sizes=half)
    ok &= store.get(f"{name}-legacy-0", target_location=dst[0][0].data_ptr(), target_sizes=half)
    keys = [f"{name}-legacy-b{i}" for i in (0, 1)]
    ok &= store.batch_set(keys, target_locations=[p[0].data_ptr() for p in src], target_sizes=[half] * 2)
    got = store.batch_get(keys, target_locations=[p[0].data_ptr() for p in dst], target_sizes=[half] * 2)
    # batch_get counts pages (an MHA page is a K and a V key): two K keys are one.
    return bool(ok) and got == 1 and all(torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))
                                         for a, b in zip(src, dst))


def run_case(spec, name, mla, layout, route):
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore
    _, host = build_pools(mla, layout, "mooncake" if route == "standalone" else "default")
    gen = torch.Generator().manual_seed(spec["seed"] + sum(map(ord, name)))
    raw = host.kv_buffer.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    use_route(route, spec["master"], os.path.join(os.path.dirname(os.path.abspath(sys.argv[2])),
                                                  "sglang_mooncake.json"))
    store = MooncakeStore(storage_config(mla, route, spec["master"], spec.get("standalone")), host)
    store.register_mem_pool_host(host)
    keys = [f"{name}-{i}" for i in range(PAGES)]
    src = torch.arange(0, PAGES * PAGE)
    dst = torch.arange(PAGES * PAGE, 2 * PAGES * PAGE)
    for t in dst[::PAGE]:  # the read target starts as zeros
        host.get_data_page(int(t), flat=False).zero_()
    result = {}
    if spec["mode"] == "write":
        result["set"] = store.batch_set_v1(keys, src)
    result["exists"] = store.batch_exists(keys)
    result["get"] = store.batch_get_v1(keys, dst)
    result["exact"] = all(torch.equal(page_bytes(host, int(a)), page_bytes(host, int(b)))
                          for a, b in zip(src[::PAGE], dst[::PAGE]))
    result["page_bytes"] = page_bytes(host, 0).numel()
    if spec["mode"] == "write" and name == "mha_page_first":
        result["legacy"] = legacy_api(store, host, name)
    if route == "standalone":
        result["allocator"] = type(host.allocator).__name__
        result["setup_dummy"] = hasattr(store.store, "_mem_pool_budget")  # set by our setup_dummy
    store.close()
    return result


def main():
    spec = json.load(open(sys.argv[1]))
    import mooncake.store
    out = {"impl": "ours" if getattr(mooncake.store, "__mooncake_cxl_shim__", False) else "reference",
           "cases": {}}
    for name, mla, layout, route in spec["cases"]:
        out["cases"][name] = run_case(spec, name, mla, layout, route)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
