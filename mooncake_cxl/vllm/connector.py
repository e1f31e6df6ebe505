"""MooncakeCXLConnector: vLLM's KVConnectorBase_V1 on the pool, the two
halves in scheduler.py and worker.py (see the package docstring)."""
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole

from .common import settings
from .metadata import MCXLMetadata


class MooncakeCXLConnector(KVConnectorBase_V1):

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._s = settings(vllm_config)
        self._sched = self._worker = None
        if role == KVConnectorRole.SCHEDULER:
            from .scheduler import SchedulerSide
            self._sched = SchedulerSide(vllm_config, self._s)
        else:
            from .worker import WorkerSide
            self._worker = WorkerSide(vllm_config, self._s)

    @property
    def requires_kv_delivery(self):
        return False  # saves are synchronous: nothing is pending when a request ends

    # ------------------------------------------------------------ scheduler

    def on_new_request(self, request):
        self._sched.on_new_request(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self._sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._sched.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self._sched.build_connector_meta(scheduler_output)

    def request_finished(self, request, block_ids):
        return self._sched.request_finished(request, block_ids)

    # --------------------------------------------------------------- worker

    def register_kv_caches(self, kv_caches):
        self._worker.register_kv_caches(kv_caches)

    def _meta(self):
        m = self._connector_metadata
        return m if isinstance(m, MCXLMetadata) else None

    def start_load_kv(self, forward_context, **kwargs):
        m = self._meta()
        if m is not None:
            self._worker.start_load_kv(m)

    def wait_for_layer_load(self, layer_name):
        self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        m = self._meta()
        if m is not None:
            self._worker.save_kv_layer(m, layer_name)

    def wait_for_save(self):
        m = self._meta()
        if m is not None:
            self._worker.wait_for_save(m)

    def get_finished(self, finished_req_ids):
        if self._worker is None:
            return None, None
        return None, (self._worker.take_recved() or None)

    def get_block_ids_with_load_errors(self):
        return self._worker.take_failed_blocks() if self._worker else set()
