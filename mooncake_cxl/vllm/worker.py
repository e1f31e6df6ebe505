"""The worker half: registers vLLM's KV cache with the store, loads a step's
prefixes layer group by layer group on a thread started before the forward
pass (wait_for_layer_load blocks only on its own group), saves each layer
group's new full blocks as soon as the forward has written them, and
announces them on the channel after the step (producer)."""
import os
import queue
import threading
import time

from ..kv import Announcer, Prefix
from .common import log, make_cache, open_store
from .watch import Watch


def _layer_index(name):
    """vLLM names layers 'model.layers.<i>.self_attn.attn'."""
    nums = [p for p in name.split(".") if p.isdigit()]
    if not nums:
        raise ValueError(f"MooncakeCXLConnector: no layer index in KV cache name {name!r}")
    return int(nums[0])


def _tp_rank():
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        return get_tensor_model_parallel_rank()
    except Exception:  # not initialised (single process): rank 0
        return 0


class WorkerSide:
    def __init__(self, vllm_config, settings):
        self.s = settings
        self.vllm_config = vllm_config
        self.store = open_store(settings)
        self.cache = make_cache(self.store, vllm_config, settings, tp_rank=_tp_rank())
        self.announcer = None
        self._layer = {}      # layer name -> index
        self._group = {}      # layer index -> group
        self._events = None   # per group: loaded (this step)
        self._thread = None
        self._failed = set()  # engine block ids whose load failed
        self._save_failed = set()
        self._pause_file = os.environ.get("MCXL_VLLM_TEST_PAUSE_FILE", "")  # tests: a stalled producer
        self._lock = threading.Lock()  # guards _failed and _recved (the asynchronous loader writes them)
        self._recved = set()
        self._async_q = None
        self._async_pending = 0
        self._prof = None     # this step's load timings (one log line per step that loaded)
        for g, layers in enumerate(self.cache.groups):
            for layer in layers:
                self._group[layer] = g

    def register_kv_caches(self, kv_caches):
        names = sorted(kv_caches, key=_layer_index)
        lay = self.cache.layout
        if len(names) != lay.num_layers:
            raise ValueError(f"MooncakeCXLConnector: {len(names)} KV cache layers, the model has {lay.num_layers}")
        num_blocks = self.vllm_config.cache_config.num_gpu_blocks
        bufs = []
        for i, name in enumerate(names):
            t = kv_caches[name]
            t = t if not isinstance(t, (list, tuple)) else t[0]
            if not t.is_contiguous():
                raise ValueError(f"MooncakeCXLConnector: KV cache of {name} is not contiguous")
            nbytes = t.numel() * t.element_size()
            per_block = nbytes // num_blocks if num_blocks else 0
            if per_block != 2 * lay.half_block_bytes or nbytes % num_blocks:
                raise ValueError(f"MooncakeCXLConnector: KV cache of {name} has {nbytes} bytes for {num_blocks} "
                                 f"blocks, expected {2 * lay.half_block_bytes} per block ({lay.tag()}, "
                                 f"shape {tuple(t.shape)})")
            self._layer[name] = i
            bufs.append((t.data_ptr(), nbytes))
        self.cache.register(bufs)
        if self.s.announces:
            self.announcer = Announcer(self.store, self.s.channel)  # claim the channel early
        log.info("MooncakeCXLConnector: %s, %d layers in %d groups, %d blocks of %d tokens, channel %r",
                 self.s.role, lay.num_layers, self.cache.layer_groups, num_blocks, lay.block_tokens,
                 self.s.channel)

    # ---------------------------------------------------------------- load

    def _load_all(self, loads):
        prof = self._prof
        for g in range(self.cache.layer_groups):
            t0 = time.perf_counter()
            for block_ids, spec in loads:
                try:
                    self.cache.load(Prefix(spec.end, spec.objects), block_ids, start=spec.start, groups=[g])
                except Exception as e:  # evicted since the lookup: vLLM recomputes these blocks
                    bad = set(block_ids[spec.start:spec.end])
                    if not bad <= self._failed:
                        log.warning("MooncakeCXLConnector: load of blocks %d..%d failed (%s); vLLM recomputes "
                                    "them", spec.start, spec.end, e)
                    self._failed |= bad
            prof["copy"].append(time.perf_counter() - t0)
            self._events[g].set()
        prof["thread_end"] = time.perf_counter()

    def start_load_kv(self, meta):
        self._announce_start(meta)
        if meta.async_loads:
            self.start_async(meta.async_loads)
        loads = [(r.block_ids, r.load) for r in meta.requests if r.load is not None and r.load.end > r.load.start]
        if not loads:
            self._events = None
            return
        self._events = [threading.Event() for _ in range(self.cache.layer_groups)]
        self._prof = {"start": time.perf_counter(), "copy": [], "wait": 0.0, "waits": 0,
                      "blocks": sum(s.end - s.start for _, s in loads)}
        self._thread = threading.Thread(target=self._load_all, args=(loads,), name="mcxl-kv-load", daemon=True)
        self._thread.start()

    def wait_for_layer_load(self, layer_name):
        if self._events is None:
            return
        i = self._layer.get(layer_name)
        if i is not None:
            ev = self._events[self._group[i]]
            if not ev.is_set():
                t0 = time.perf_counter()
                ev.wait()
                self._prof["wait"] += time.perf_counter() - t0
                self._prof["waits"] += 1

    def _join_load(self):
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            p, now = self._prof, time.perf_counter()
            c = p["copy"] or [0.0]
            log.info("MooncakeCXLConnector: step loaded %d blocks: loader %.1f ms (copies %.1f ms, per group "
                     "%.1f..%.1f ms), forward blocked %.1f ms in %d waits, step %.1f ms", p["blocks"],
                     (p.get("thread_end", now) - p["start"]) * 1e3, sum(c) * 1e3, min(c) * 1e3,
                     max(c) * 1e3, p["wait"] * 1e3, p["waits"], (now - p["start"]) * 1e3)
        self._events = None

    def take_failed_blocks(self):
        with self._lock:
            out, self._failed = self._failed, set()
        return out

    # --------------------------------------------- asynchronous (PD) loads

    def start_async(self, specs):
        if self._async_q is None:
            self._async_q = queue.Queue()
            threading.Thread(target=self._async_loop, name="mcxl-kv-async-load", daemon=True).start()
        for spec in specs:
            self._async_pending += 1
            self._async_q.put((spec, time.monotonic()))

    def _finish(self, spec, loaded, t0, why=None):
        if why:
            log.warning("MooncakeCXLConnector: request %s: %s with %d of %d blocks in the pool; vLLM recomputes "
                        "blocks %d..%d", spec.req_id, why, loaded, spec.end, loaded, spec.end)
        else:
            log.info("MooncakeCXLConnector: request %s: waited %.3f s, loaded blocks %d..%d as the producer "
                     "wrote them", spec.req_id, time.monotonic() - t0, spec.start, spec.end)
        with self._lock:
            self._failed |= set(spec.block_ids[loaded:spec.end])
            self._recved.add(spec.req_id)

    def _async_loop(self):
        """One thread: every pending request is checked after each channel
        wake-up; a load copies the blocks found since the last one."""
        watch = Watch(self.store, self.s.channel)
        active = []  # [spec, blocks loaded, start time]
        while True:
            try:
                while True:
                    spec, t0 = self._async_q.get(block=not active)
                    active.append([spec, spec.start, t0])
            except queue.Empty:
                pass
            watch.wait(0.02)  # news first, then lookups: a "done" read later could hide blocks
            for job in list(active):
                spec, loaded, t0 = job
                why = None
                try:
                    prefix = self.cache.lookup(spec.hashes).upto(spec.end)  # hashes: every full block
                    if prefix.blocks > loaded:
                        self.cache.load(prefix, spec.block_ids, start=loaded)
                        job[1] = loaded = prefix.blocks
                except Exception as e:  # evicted under us, say
                    why = f"load failed ({e})"
                news = watch.get(spec.key)
                if why is None and loaded < spec.end:
                    if news is not None and (news.done or news.aborted):
                        why = "the producer " + ("aborted it" if news.aborted else "finished it")
                    elif time.monotonic() - t0 > spec.budget_s:
                        why = f"timed out after {spec.budget_s:.1f} s waiting for the producer"
                    elif not watch.producer_alive(news):
                        why = f"producer pid {watch.producer_pid(news)} is gone"
                    else:
                        continue
                active.remove(job)
                self._finish(spec, loaded, t0, why)

    def take_recved(self):
        with self._lock:
            out, self._recved = self._recved, set()
        self._async_pending -= len(out)
        return out

    def idle_wait(self, meta):
        """An empty step while asynchronous loads run: vLLM's engine loop
        would spin; sleep a little instead."""
        if self._async_pending and not meta.requests and not meta.async_loads:
            time.sleep(0.005)

    # ---------------------------------------------------------------- save

    def save_kv_layer(self, meta, layer_name):
        i = self._layer.get(layer_name)
        if i is None or self.cache.groups[self._group[i]][-1] != i:
            return  # saved once the group's last layer is written
        g = self._group[i]
        for r in meta.requests:
            sv = r.save
            if sv is None or sv.end <= sv.start or r.req_id in self._save_failed:
                continue
            try:
                self.cache.save(sv.hashes, r.block_ids, start=sv.start, groups=[g])
            except Exception as e:  # the pool is full, say: a later request misses, nothing breaks
                log.warning("MooncakeCXLConnector: save of request %s blocks %d..%d failed: %s",
                            r.req_id, sv.start, sv.end, e)
                self._save_failed.add(r.req_id)

    def _announce_start(self, meta):
        if self.announcer is None:
            return
        for key in meta.aborted_keys:
            self.announcer.request_aborted(key)
        for r in meta.requests:
            if r.save is not None and r.save.first and r.save.key is not None:
                self.announcer.blocks_ready(r.save.key, 0, 0)  # "this request is being prefilled here"

    def wait_for_save(self, meta):
        self._join_load()
        self.idle_wait(meta)
        if self.announcer is None:
            self._save_failed.clear()
            return
        for r in meta.requests:
            sv = r.save
            if sv is None or sv.key is None:
                continue
            if r.req_id in self._save_failed:
                self.announcer.request_aborted(sv.key)
                continue
            if sv.end > sv.start:
                self.announcer.blocks_ready(sv.key, sv.start, sv.end)
            if sv.done:
                self.announcer.request_done(sv.key, sv.end)
        self._save_failed.clear()
        while self._pause_file and os.path.exists(self._pause_file):
            time.sleep(0.05)
