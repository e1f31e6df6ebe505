"""What the scheduler and worker halves share: the extra config, the store
connection, the block cache's shape (derived from vLLM's config the same way
on both sides, so their keys agree) and a request's announcement key."""
import os
from dataclasses import dataclass

from vllm.logger import init_logger

from ..kv import BlockKVCache, KVLayout, Namespace, request_key

log = init_logger("vllm.mooncake_cxl")  # under "vllm": vLLM's handlers print our lines

_TORCH_DTYPES = {"torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32",
                 "torch.float8_e4m3fn": "float8_e4m3fn", "torch.float8_e5m2": "float8_e5m2",
                 "torch.uint8": "uint8", "torch.int8": "int8"}


@dataclass
class Settings:
    role: str                      # kv_producer, kv_consumer, kv_both
    master: str                    # master_server_address
    channel: str = "mcxl-vllm-pd"  # announcement channel (one producer per channel)
    blocks_per_object: int = 16
    layer_groups: int = 0          # 0: one group per layer (layer-wise save and load)
    wait_timeout_s: float = 30.0   # longest a consumer waits for a live producer
    model_tag: str = ""            # namespace model name (default: the served model path)
    protocol: str = "cxl"
    async_load: bool = True        # load while the producer writes (needs kv_load_failure_policy=recompute)
    load_last_block: bool = True   # a block-aligned prompt, all stored: vLLM computes its last token only

    @property
    def saves(self):
        return self.role in ("kv_producer", "kv_both", "kv_consumer")  # a consumer writes back

    @property
    def announces(self):
        return self.role == "kv_producer"

    @property
    def waits(self):
        return self.role == "kv_consumer"


def settings(vllm_config):
    kt = vllm_config.kv_transfer_config
    extra = dict(kt.kv_connector_extra_config or {})
    master = extra.get("master_server_address") or os.environ.get("MCXL_MASTER", "")
    if not master:
        raise ValueError("MooncakeCXLConnector: kv_connector_extra_config needs "
                         "'master_server_address' (host:port of the mooncake_cxl master)")
    role = kt.kv_role or "kv_both"
    if role not in ("kv_producer", "kv_consumer", "kv_both"):
        raise ValueError(f"MooncakeCXLConnector: unknown kv_role {role!r}")
    return Settings(role=role, master=master, channel=str(extra.get("channel", Settings.channel)),
                    blocks_per_object=int(extra.get("blocks_per_object", 16)),
                    layer_groups=int(extra.get("layer_groups", 0)),
                    wait_timeout_s=float(extra.get("wait_timeout_s", 30.0)),
                    model_tag=str(extra.get("model_tag", "")), protocol=str(extra.get("protocol", "cxl")),
                    async_load=bool(extra.get("async_load", True)),
                    load_last_block=bool(extra.get("load_last_block", True)))


def open_store(s):
    from ..store import MooncakeDistributedStore
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, s.protocol, "", s.master)
    if rc != 0:
        raise RuntimeError(f"MooncakeCXLConnector: store setup with master {s.master} returned {rc}")
    return store


def kv_dtype(vllm_config):
    cd = vllm_config.cache_config.cache_dtype
    if cd in (None, "auto"):
        return _TORCH_DTYPES[str(vllm_config.model_config.dtype)]
    return {"fp8": "fp8", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}.get(cd, cd)


def make_layout(vllm_config):
    """vLLM's CPU/flash cache is [blocks, heads, block tokens, 2 * head dim]
    per layer: one block's K and V are contiguous, which is all the store sees
    (order 'block_first': block b = 2 halves at b * 2 * half_block_bytes)."""
    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    return KVLayout(num_layers=mc.get_num_layers(pc), block_tokens=vllm_config.cache_config.block_size,
                    num_kv_heads=mc.get_num_kv_heads(pc), head_dim=mc.get_head_size(),
                    dtype=kv_dtype(vllm_config), order="block_first")


def make_cache(store, vllm_config, s, tp_rank=0):
    """The scheduler half looks up rank 0's blocks (every TP rank stores the
    same prefixes); each worker stores and loads its own rank's."""
    layout = make_layout(vllm_config)
    pc = vllm_config.parallel_config
    ns = Namespace(s.model_tag or str(vllm_config.model_config.model), tp_rank=tp_rank,
                   tp_size=pc.tensor_parallel_size, pp_size=pc.pipeline_parallel_size)
    groups = s.layer_groups or layout.num_layers
    return BlockKVCache(store, layout, ns, blocks_per_object=s.blocks_per_object,
                        layer_groups=min(groups, layout.num_layers))


def announce_key(prompt_hashes):
    """A request's key on the channel: its prompt's last full-block hash, so
    producer and consumer agree with no coordination (None: no full block)."""
    return request_key(prompt_hashes[-1]) if prompt_hashes else None
