"""mooncake_cxl.vllm: our vLLM KV connector on the pool (mooncake_cxl.kv).

    LLM(model=..., kv_transfer_config={
        "kv_connector": "MooncakeCXLConnector",
        "kv_connector_module_path": "mooncake_cxl.vllm",
        "kv_role": "kv_producer" | "kv_consumer" | "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"master_server_address": "127.0.0.1:50051"}})

Roles: a producer (prefill) saves each layer's full blocks as vLLM computes
them and announces them on a channel in the pool; a consumer (decode) finds
the longest stored prefix in one lookup, waits on the channel while a live
producer is still writing the request's blocks (deadline; a dead or silent
producer => it loads what is there and vLLM recomputes the rest), loads layer
by layer while the forward pass runs, and writes back its own new full blocks.
kv_both does both, without waiting. Files: common.py (config, cache shape),
metadata.py (scheduler -> worker), scheduler.py, worker.py, connector.py.
Importing mooncake_cxl never imports this package; this package needs vLLM.
"""
from .connector import MooncakeCXLConnector

__all__ = ["MooncakeCXLConnector"]
