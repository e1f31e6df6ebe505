"""SGLang's HiCache v2 API (a speculative-decoding draft pool beside the target
KV pool) with Mooncake group semantics (extra_config enable_group_semantics:
every page's K, V, draft K and draft V share one ReplicateConfig.group_ids
entry), through SGLang's own MooncakeStore, run as a script by the engines
interpreter:

    python sglang_draft_workers.py spec.json out.json

spec: {"mode": "write"|"read"|"evict", "master": "host:port", "seed": int,
"groups": bool, "pages": int}.

* "write": batch_set_v1 (target K/V) and batch_set_v2 (draft K/V) of
  PAGES pages, batch_exists_v2, batch_get_v1/batch_get_v2 into other pages.
* "read" (a fresh process): batch_exists_v2, then both gets.
* "evict": one page written and read (its target K/V leased), then `pages`
  more pages in batches of BATCH (several times the pool); then per page
  which of its four objects exist, and the survivors read back.

out.json: per step the calls' results and whether the pages came back
byte-exact; "evict" adds the per-page presence of [K, V, draft K, draft V].
"""
import json
import sys

import torch

from sglang_workers import PAGE, storage_config

PAGES, BATCH = 8, 8
TARGET = dict(layers=4, heads=4, head_dim=128, tokens=512)  # K and V 64 KiB a page
DRAFT = dict(layers=1, heads=4, head_dim=128, tokens=512)  # an EAGLE-style one-layer draft: 16 KiB  # an EAGLE-style one-layer draft model


def build_host_pool(layers, heads, head_dim, tokens, label):
    """A CPU MHA device pool and SGLang's page_first host pool for it (as
    _build_mha_mla_host_pool, without pinned memory: a CUDA call)."""
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _mha_host_inputs
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    dev = MHATokenToKVPool(tokens, PAGE, torch.float16, heads, head_dim, layers, "cpu", False,
                           start_layer=0, end_layer=layers - 1)
    host_cls, host_input, host_kwargs = _mha_host_inputs(dev)
    return host_cls(host_input, **host_kwargs, host_to_device_ratio=2.0, host_size=0, page_size=PAGE,
                    layout="page_first", pin_memory=False, allocator_type="default", pool_label=label)


def fill(host, seed, first_page, pages):
    """Seeded bytes into `pages` host pages from `first_page` (page_first: a page is a row)."""
    gen = torch.Generator().manual_seed(seed)
    rows = host.kv_buffer.view(torch.uint8)[:, first_page * PAGE:(first_page + pages) * PAGE]
    rows.copy_(torch.randint(0, 256, rows.shape, dtype=torch.uint8, generator=gen))


def pages_equal(host, a, b, pages):
    raw = host.kv_buffer.view(torch.uint8)
    return torch.equal(raw[:, a * PAGE:(a + pages) * PAGE], raw[:, b * PAGE:(b + pages) * PAGE])


def zero(host, first_page, pages):
    host.kv_buffer.view(torch.uint8)[:, first_page * PAGE:(first_page + pages) * PAGE].zero_()


class Draft:
    """SGLang's MooncakeStore with the target pool registered as its KV pool
    and the draft pool through register_mem_host_pool_v2, as HiCache does."""

    def __init__(self, spec):
        from sglang.srt.mem_cache.hicache_storage import PoolName
        from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore
        self.target = build_host_pool(**TARGET, label="kv")
        self.draft = build_host_pool(**DRAFT, label="draft")
        cfg = storage_config(False, "extra", spec["master"])
        cfg.extra_config["enable_group_semantics"] = spec["groups"]
        self.store = MooncakeStore(cfg, self.target)
        self.store.register_mem_pool_host(self.target)
        self.store.register_mem_host_pool_v2(self.target, PoolName.KV)
        self.store.register_mem_host_pool_v2(self.draft, PoolName.DRAFT)
        self.name = PoolName.DRAFT

    def transfer(self, keys, first_page=None):
        from sglang.srt.mem_cache.hicache_storage import PoolTransfer
        idx = None if first_page is None else torch.arange(first_page * PAGE, (first_page + len(keys)) * PAGE)
        return PoolTransfer(name=self.name, host_indices=idx, keys=keys)

    def _both(self, v1, v2, keys, first_page):
        """Target pages through SGLang's v1 call, draft pages through v2: (results, results)."""
        idx = torch.arange(first_page * PAGE, (first_page + len(keys)) * PAGE)
        return v1(keys, idx), v2([self.transfer(keys, first_page)])[self.name]

    def set(self, keys, first_page):
        return self._both(self.store.batch_set_v1, self.store.batch_set_v2, keys, first_page)

    def get(self, keys, first_page):
        return self._both(self.store.batch_get_v1, self.store.batch_get_v2, keys, first_page)

    def exists(self, keys):
        r = self.store.batch_exists_v2(keys, [self.transfer(keys)])
        return r.kv_hit_pages, r.extra_pool_hit_pages.get(self.name, 0)

    def objects(self, key):
        """Which of the page's four objects (K, V, draft K, draft V) exist."""
        names, _ = self.store._get_hybrid_page_component_keys([key], self.transfer([key]))
        kv = [f"{t}_{self.store.mha_suffix}_{c}" for t in self.store._tag_keys([key]) for c in "kv"]
        return [r == 1 for r in self.store._batch_exist(kv + self.store._tag_keys(names))]

    def exact(self, a, b, pages):
        return pages_equal(self.target, a, b, pages) and pages_equal(self.draft, a, b, pages)


def write_read(spec):
    d = Draft(spec)
    fill(d.target, spec["seed"], 0, PAGES)
    fill(d.draft, spec["seed"] + 1, 0, PAGES)
    zero(d.target, PAGES, PAGES)
    zero(d.draft, PAGES, PAGES)
    keys = [f"draft-page-{i}" for i in range(PAGES)]
    out = {"group_semantics": d.store._can_use_group_semantics()}
    if spec["mode"] == "write":
        out["set"] = d.set(keys, 0)
    out["exists"] = d.exists(keys)
    out["get"] = d.get(keys, PAGES)
    out["exact"] = d.exact(0, PAGES, PAGES)
    d.store.close()
    return out


def evict(spec):
    """The first page's target K/V read (leased) before the pool overflows:
    with group semantics its draft objects share that protection."""
    d = Draft(spec)
    out = {"group_semantics": d.store._can_use_group_semantics()}
    fill(d.target, spec["seed"], 0, BATCH)
    fill(d.draft, spec["seed"] + 1, 0, BATCH)
    out["first_set"] = d.set(["evict-first"], 0)
    out["first_get"] = d.store.batch_get_v1(["evict-first"], torch.arange(BATCH * PAGE, (BATCH + 1) * PAGE))
    keys = [f"evict-{i}" for i in range(spec["pages"])]
    out["set_failed"] = 0
    for b in range(0, len(keys), BATCH):
        kv, draft = d.set(keys[b:b + BATCH], 0)
        out["set_failed"] += kv.count(False) + draft.count(False)
    out["first"] = d.objects("evict-first")
    out["presence"] = [d.objects(k) for k in keys]
    # Every survivor holds the batch's bytes (each batch wrote host pages 0..BATCH-1).
    out["survivors_exact"] = True
    for b in range(0, len(keys), BATCH):
        alive = [k for k, p in zip(keys[b:b + BATCH], out["presence"][b:b + BATCH]) if all(p)]
        for k in alive:
            slot = keys.index(k) - b
            zero(d.target, BATCH, 1)
            zero(d.draft, BATCH, 1)
            kv, draft = d.get([k], BATCH)
            out["survivors_exact"] &= (kv == [True] and draft == [True] and pages_equal(d.target, slot, BATCH, 1)
                                       and pages_equal(d.draft, slot, BATCH, 1))
    d.store.close()
    return out


def main():
    spec = json.load(open(sys.argv[1]))
    import mooncake.store
    out = {"impl": "ours" if getattr(mooncake.store, "__mooncake_cxl_shim__", False) else "reference"}
    out.update(evict(spec) if spec["mode"] == "evict" else write_read(spec))
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
