"""mooncake_cxl.vllm: our vLLM KV connector on the pool (mooncake_cxl.kv).

    LLM(model=..., kv_transfer_config={
        "kv_connector": "MooncakeCXLConnector",
        "kv_connector_module_path": "mooncake_cxl.vllm",
        "kv_role": "kv_producer" | "kv_consumer" | "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"master_server_address": "127.0.0.1:50051"}})

Roles: a producer (prefill) saves each layer group's new full blocks as
soon as vLLM's forward has written them and announces them on a channel in
the pool after each step; a consumer (decode) finds the longest stored prefix
in one lookup and loads it layer group by layer group while the forward pass
runs; while a live producer is still writing the request's blocks it waits:
with kv_load_failure_policy "recompute", vLLM parks the request and our
worker loads blocks as they are announced (asynchronous load), otherwise the
scheduler asks again each step. A deadline, a dead producer (its pid) or an
abort ends the wait: what is stored loads, the rest is reported as not loaded
and vLLM recomputes it, with one log line. The consumer writes its own new
full blocks back. kv_both saves and loads, and waits only for requests whose
kv_transfer_params carry {"mcxl_wait_s": seconds}; {"mcxl_async": false}
forces the step-by-step wait. vLLM computes at least a prompt's last token:
for a prompt ending on a block boundary whose blocks are all stored (found
without waiting), the consumer loads the last block too and offers all
tokens but one, so vLLM computes one token instead of the whole last block
(vLLM's own Mooncake connector offers whole blocks only; load_last_block:
false does the same). Extra config: master_server_address (required),
channel, blocks_per_object (16), layer_groups (0: one per layer),
wait_timeout_s (30), async_load (true), load_last_block (true), model_tag. Files: common.py (config,
cache shape), metadata.py (scheduler -> worker), watch.py (channel state),
scheduler.py, worker.py, connector.py.
Importing mooncake_cxl never imports this package; this package needs vLLM.
"""
from ..extras import require

require("mooncake_cxl.vllm (the vLLM connector)", "vllm")

from .connector import MooncakeCXLConnector  # noqa: E402 (after the check: it imports vllm)

__all__ = ["MooncakeCXLConnector"]
