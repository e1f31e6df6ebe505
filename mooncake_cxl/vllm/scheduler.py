"""The scheduler half: which prefix to load (one lookup), whether to wait for
a producer still writing it (announcements in the pool), and which new full
blocks the worker saves each step."""
import time
from dataclasses import dataclass, field

from .common import announce_key, log, make_cache, open_store
from .metadata import AsyncLoadSpec, LoadSpec, MCXLMetadata, ReqSpec, SaveSpec
from .watch import Watch


@dataclass
class _Req:
    request: object
    hashes: list                 # chained hashes of the request's full blocks so far
    key: int | None              # announcement key (its prompt's last full block)
    block_ids: list = field(default_factory=list)
    saved: int = 0               # leading blocks known to be in the store
    load: LoadSpec | None = None
    started: bool = False
    done_sent: bool = False
    wait_start: float | None = None
    waited_logged: bool = False
    budget_left: float = 0.0


class SchedulerSide:
    def __init__(self, vllm_config, settings):
        self.s = settings
        self.store = open_store(settings)
        self.cache = make_cache(self.store, vllm_config, settings)
        self.bs = self.cache.layout.block_tokens
        self._reqs = {}
        self._plans = {}         # req_id -> Prefix found by get_num_new_matched_tokens
        self._aborted = []
        self._watch = None
        self._idle = False
        self._async_new = []
        self._lookup_ms = 0.0
        # Loading while the producer writes (vLLM's asynchronous load) needs a
        # failed load to mean "recompute" (vLLM's default fails the request).
        self._async_ok = (settings.async_load and
                          vllm_config.kv_transfer_config.kv_load_failure_policy == "recompute")

    # ------------------------------------------------------------ requests

    def _state(self, request):
        st = self._reqs.get(request.request_id)
        if st is None:
            hashes = self.cache.block_hashes(request.prompt_token_ids or [])
            st = _Req(request, hashes, announce_key(hashes))
            self._reqs[request.request_id] = st
        return st

    def on_new_request(self, request):
        self._state(request)

    # --------------------------------------------------------- the channel

    def _channel(self):
        if self._watch is None:
            self._watch = Watch(self.store, self.s.channel)
        return self._watch

    def _verdict(self, st, need, have):
        """'wait' (ask again next step), 'async' (a live producer is writing
        blocks [have, need): the worker loads them as they are announced) or
        'stop' (it is done, gone or past the deadline: vLLM recomputes what
        is missing; one log line says why)."""
        params = st.request.kv_transfer_params or {}
        explicit = params.get("mcxl_wait_s")
        watch = self._channel()
        now = time.monotonic()
        if st.wait_start is None:
            st.wait_start = now
        news = watch.get(st.key)
        rid, waited = st.request.request_id, now - st.wait_start
        budget = float(explicit) if explicit else self.s.wait_timeout_s
        if news is not None and (news.done or news.aborted):
            log.warning("MooncakeCXLConnector: request %s: the producer %s it with %d of %d blocks in "
                        "the pool; recomputing blocks %d..%d", rid,
                        "aborted" if news.aborted else "finished", have, need, have, need)
            return "stop"
        if waited > budget:
            log.warning("MooncakeCXLConnector: request %s: timed out after %.1f s waiting for the producer "
                        "(%d of %d blocks in the pool); recomputing blocks %d..%d", rid, waited, have, need,
                        have, need)
            return "stop"
        if news is None:
            return "wait" if explicit else "stop"  # no producer has this request (yet): wait only when asked
        if not watch.producer_alive(news):
            log.warning("MooncakeCXLConnector: request %s: producer pid %d is gone with %d of %d blocks in "
                        "the pool; recomputing blocks %d..%d", rid, watch.producer_pid(news), have, need,
                        have, need)
            return "stop"
        st.budget_left = budget - waited
        return "async" if self._async_ok and params.get("mcxl_async", True) else "wait"

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        st = self._state(request)
        # Look up every full block (a run's object is keyed by its last block:
        # a prompt ending on a run boundary is found only with that block), but
        # offer at most `need`: vLLM computes at least the prompt's last token,
        # so the last run may load only its first blocks (Prefix.upto).
        full = request.num_prompt_tokens // self.bs
        need = (request.num_prompt_tokens - 1) // self.bs
        if need * self.bs <= num_computed_tokens:
            return 0, False
        explicit = (request.kv_transfer_params or {}).get("mcxl_wait_s")
        may_wait = st.key is not None and (self.s.waits or explicit)
        if may_wait:  # news first, then the lookup: a "done" read after it could hide its last blocks
            self._channel().poll()
        t0 = time.perf_counter()
        whole = self.cache.lookup(st.hashes[:full])
        prefix = whole.upto(need)
        self._lookup_ms = (time.perf_counter() - t0) * 1e3
        verdict = self._verdict(st, need, prefix.blocks) if prefix.blocks < need and may_wait else "stop"
        if verdict == "wait":
            if self._idle:  # nothing else to run: sleep on the channel's futex, not a busy loop
                self._watch.wait(0.02)
            return None, False
        if verdict == "async":
            self._plans[request.request_id] = need
            return need * self.bs - num_computed_tokens, True
        if st.wait_start is not None and not st.waited_logged:
            st.waited_logged = True
            log.info("MooncakeCXLConnector: request %s: waited %.3f s for the producer, %d of %d blocks in "
                     "the pool", request.request_id, time.monotonic() - st.wait_start, prefix.blocks, need)
        got = prefix.blocks * self.bs
        if (self.s.load_last_block and st.wait_start is None and full > need
                and whole.blocks == full):
            # A prompt ending on a block boundary, all of it stored: load the
            # last block too and leave vLLM only the last token to compute
            # (128 tokens less of the longest-context attention).
            prefix, got = whole, request.num_prompt_tokens - 1
        if got <= num_computed_tokens:
            self._plans.pop(request.request_id, None)
            return 0, False
        self._plans[request.request_id] = (prefix, got)
        return got - num_computed_tokens, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        prefix = self._plans.pop(request.request_id, None)
        if num_external_tokens <= 0 or prefix is None:
            return
        st = self._state(request)
        if isinstance(prefix, int):  # asynchronous: blocks [start, need) as the producer announces them
            need = prefix
            start = max(0, (need * self.bs - num_external_tokens) // self.bs)
            full = request.num_prompt_tokens // self.bs
            self._async_new.append(AsyncLoadSpec(request.request_id, list(blocks.get_block_ids()[0]), start,
                                                 need, st.hashes[:full], st.key, st.budget_left))
            st.saved = max(st.saved, need)
            log.info("MooncakeCXLConnector: request %s: loading blocks %d..%d while the producer writes them",
                     request.request_id, start, need)
            return
        prefix, got = prefix
        start = (got - num_external_tokens) // self.bs  # vLLM's own prefix-cache hits: whole blocks
        st.load = LoadSpec(start=max(0, start), end=prefix.blocks, objects=list(prefix.objects))
        st.saved = max(st.saved, prefix.blocks)
        log.info("MooncakeCXLConnector: request %s: loading blocks %d..%d of %d from the pool (%d tokens; "
                 "lookup %.1f ms)", request.request_id, st.load.start, st.load.end, len(st.hashes),
                 num_external_tokens, self._lookup_ms)

    # ---------------------------------------------------------------- steps

    def _save_spec(self, st, computed_after):
        if not self.s.saves:
            return None
        req = st.request
        full = min(computed_after, req.num_tokens) // self.bs
        if len(st.hashes) < full:  # decode grew the request: extend the chain
            toks = req.all_token_ids[len(st.hashes) * self.bs:full * self.bs]
            st.hashes += self.cache.block_hashes(toks, parent=st.hashes[-1] if st.hashes else None)
        announce = self.s.announces and st.key is not None
        done = announce and not st.done_sent and computed_after >= req.num_prompt_tokens
        first = announce and not st.started
        if full <= st.saved and not done and not first:
            return None
        spec = SaveSpec(start=min(st.saved, full), end=full, hashes=st.hashes[:full],
                        key=st.key if announce else None, first=first, done=done)
        st.saved, st.started = max(st.saved, full), True
        st.done_sent = st.done_sent or done
        return spec

    def _spec(self, st, computed_after):
        load, st.load = st.load, None
        save = self._save_spec(st, computed_after)
        if load is None and save is None:
            return None
        return ReqSpec(st.request.request_id, list(st.block_ids), load, save)

    def build_connector_meta(self, so):
        meta = MCXLMetadata(aborted_keys=self._aborted, async_loads=self._async_new)
        self._aborted, self._async_new = [], []
        self._idle = so.total_num_scheduled_tokens == 0
        for new in so.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = list(new.block_ids[0])
            spec = self._spec(st, new.num_computed_tokens + so.num_scheduled_tokens.get(new.req_id, 0))
            if spec:
                meta.requests.append(spec)
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            st = self._reqs.get(rid)
            if st is None:
                continue
            nb = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids:
                st.block_ids = list(nb[0]) if nb else []
            elif nb:
                st.block_ids.extend(nb[0])
            spec = self._spec(st, cached.num_computed_tokens[i] + so.num_scheduled_tokens.get(rid, 0))
            if spec:
                meta.requests.append(spec)
        return meta

    def request_finished(self, request, block_ids):
        st = self._reqs.pop(request.request_id, None)
        self._plans.pop(request.request_id, None)
        if st is not None and self.s.announces and st.started and not st.done_sent and st.key is not None:
            self._aborted.append(st.key)  # consumers waiting on it recompute
        return False, None
