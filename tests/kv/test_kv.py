"""mooncake_cxl.kv: the block KV cache on the pool.

Two processes (prefill saves, decode finds the longest prefix and loads, every
byte checked), chained keys with prefix semantics, namespaces that never
collide, run aggregation (tails, extension, partial loads) and the
aggregation benchmark function."""
import numpy as np
import pytest

import kv_workers as W
from conftest import connect
from mooncake_cxl.kv import BlockKVCache, KVCacheError, KVLayout, Namespace
from mooncake_cxl.kv.bench import measure_aggregation


@pytest.mark.parametrize("n_obj,groups", [(1, 4), (4, 2), (16, 1)],
                         ids=["per-block-per-layer", "runs4-groups2", "runs16"])
def test_prefill_and_decode_processes(master, children, n_obj, groups):
    """Prefill saves 10 blocks (+ a partial block's tokens). Decode of the same
    request (the PD hand-off) finds all 10 and loads them byte for byte into
    other engine blocks. A request sharing 7 blocks and 3 tokens finds the
    shared blocks down to a run boundary (runs are keyed by their last block:
    the price of aggregation, exact with one block per object); blocks past
    the prefix stay untouched."""
    bt = W.LAYOUT["block_tokens"]
    p = children(W.prefill, master.address, n_obj, groups, 42, 10 * bt + 3).result()
    assert p["blocks"] == 10 and p["written"] == len(range(0, 10, n_obj)) * groups
    same = children(W.decode, master.address, n_obj, groups, 42, 12 * bt, 10 * bt + 5).result()
    assert same["prefix"] == 10 and same["objects"] == len(range(0, 10, n_obj)), same
    assert same["loaded"] == 10 and same["bad"] == 0 and same["view_bad"] == 0 and same["untouched"], same
    part = children(W.decode, master.address, n_obj, groups, 42, 12 * bt, 7 * bt + 3).result()
    assert part["prefix"] == 7 // n_obj * n_obj, part
    assert part["bad"] == 0 and part["view_bad"] == 0 and part["untouched"], part
    # A second save of the same request writes nothing new.
    again = children(W.prefill, master.address, n_obj, groups, 42, 10 * bt + 3).result()
    assert again["written"] == 0


def test_chained_keys_give_prefix_semantics(master):
    s = connect(master)
    cache = W.make_cache(s, 4, 1)
    bt = W.LAYOUT["block_tokens"]
    t = W.tokens(1, 6 * bt + 5)
    h = cache.block_hashes(t)
    assert len(h) == 6  # the partial block has no key
    assert cache.block_hashes(t[:3 * bt]) == h[:3]  # a prefix has the prefix's keys
    u = t.copy()
    u[4 * bt + 1] += 1  # one token in block 4
    hu = cache.block_hashes(u)
    assert hu[:4] == h[:4] and all(a != b for a, b in zip(hu[4:], h[4:]))
    v = t.copy()
    v[0] += 1  # the first token changes every key
    assert all(a != b for a, b in zip(cache.block_hashes(v), h))
    assert cache.block_hashes(t[3 * bt:], parent=h[2]) == h[3:]  # continue a chain
    # Same tokens in a different block order: different keys (not a bag of blocks).
    swapped = np.concatenate([t[bt:2 * bt], t[:bt]])
    assert cache.block_hashes(swapped)[1] != h[1]
    s.close()


def test_namespaces_never_collide(master):
    """Same tokens under another model, rank, layout or aggregation: other
    keys; each cache finds and loads only its own bytes."""
    s = connect(master)
    lay = KVLayout(**W.LAYOUT)
    t = W.tokens(7, 4 * lay.block_tokens)
    base = BlockKVCache(s, lay, Namespace("tiny"), blocks_per_object=2)
    others = [BlockKVCache(s, lay, Namespace("other-model"), blocks_per_object=2),
              BlockKVCache(s, lay, Namespace("tiny", tp_rank=1, tp_size=2), blocks_per_object=2),
              BlockKVCache(s, lay, Namespace("tiny", pp_rank=1, pp_size=2), blocks_per_object=2),
              BlockKVCache(s, KVLayout(**dict(W.LAYOUT, head_dim=8)), Namespace("tiny"), blocks_per_object=2),
              BlockKVCache(s, KVLayout(**dict(W.LAYOUT, order="block_first")), Namespace("tiny"),
                           blocks_per_object=2),
              BlockKVCache(s, lay, Namespace("tiny"), blocks_per_object=4),
              BlockKVCache(s, lay, Namespace("tiny", salt="lora-a"), blocks_per_object=2)]
    assert len({c.prefix for c in [base] + others}) == 1 + len(others)
    buf = lay.allocate(8)
    base.register(buf)
    hb = base.block_hashes(t)
    W.fill_engine(base, buf, hb, range(4))
    assert base.save(hb, range(4)) == 2
    for o in others:
        assert o.lookup(o.block_hashes(t)).blocks == 0, o.namespace
    # Another model stores the same tokens with other bytes; each loads its own.
    other = others[0]
    obuf = lay.allocate(8)
    other.register(obuf)
    ho = other.block_hashes(t)
    assert ho != hb
    W.fill_engine(other, obuf, ho, range(4), model="other-model")
    assert other.save(ho, range(4)) == 2
    for c, hashes, model in ((base, hb, "tiny"), (other, ho, "other-model")):
        for a in (buf if c is base else obuf):
            a[...] = 0
        prefix = c.lookup(hashes)
        assert c.load(prefix, [7, 6, 5, 4]) == 4
        assert W.check_engine(c, buf if c is base else obuf, hashes, [7, 6, 5, 4], model=model) == 0
    s.close()


def test_tails_extension_and_partial_load(master):
    """runs of 4: a 6-block request is one run + a 2-block tail; a 10-block
    request sharing it loads 6, saves only what is new, then finds 10; a load
    that skips the engine's first 5 blocks reads parts of objects."""
    s = connect(master)
    cache = W.make_cache(s, 4, 2)
    bt = cache.layout.block_tokens
    t = W.tokens(3, 10 * bt)
    h = cache.block_hashes(t)
    buf = cache.layout.allocate(16)
    cache.register(buf)
    W.fill_engine(cache, buf, h, range(10))
    assert cache.save(h[:6], range(6)) == 2 * 2  # (run 0, tail 4..5) x 2 groups
    p = cache.lookup(h)
    assert p.blocks == 6 and [(a, b) for a, b, _ in p.objects] == [(0, 4), (4, 2)]
    assert cache.save(h, range(10), start=6) == 2 * 2  # run 4..7 (full now) and tail 8..9
    p = cache.lookup(h)
    assert p.blocks == 10 and [(a, b) for a, b, _ in p.objects] == [(0, 4), (4, 4), (8, 2)]
    assert cache.lookup(h[:5]).blocks == 4  # no object ends at block 4
    for a in buf:
        a[...] = 0
    dst = list(range(15, 5, -1))
    assert cache.load(p, dst, start=5) == 5
    assert W.check_engine(cache, buf, h[5:], dst[5:]) == 0
    assert not any(a[:, dst[:5]].any() for a in buf)  # skipped blocks untouched
    # An object evicted between lookup and load: a clear error, not garbage.
    assert cache.remove(p, force=True) == 3 * 2
    with pytest.raises(KVCacheError):
        cache.load(p, dst)
    assert cache.lookup(h).blocks == 0
    s.close()


def test_bad_input_is_refused(master):
    s = connect(master)
    cache = W.make_cache(s, 4, 1)
    with pytest.raises(RuntimeError):
        cache.save([b"x" * 16], [0])  # no buffers registered
    with pytest.raises(ValueError):
        cache.register(cache.layout.allocate(4)[:2])  # wrong layer count
    with pytest.raises(ValueError):
        KVLayout(num_layers=0, block_tokens=8, num_kv_heads=1, head_dim=1)
    with pytest.raises(ValueError):
        KVLayout(num_layers=1, block_tokens=8, num_kv_heads=1, head_dim=1, dtype="complex")
    cache.register(cache.layout.allocate(4))
    h = cache.block_hashes(W.tokens(0, 8 * 8))
    with pytest.raises(IndexError):
        cache.save(h, range(8))  # engine block 4.. out of range
    assert s.batch_is_exist(["anything"]) == [0]  # the store is still usable
    s.close()


def test_aggregation_benchmark_function(master):
    """Both formats move the same bytes (the function checks them); aggregated
    needs far fewer objects."""
    s = connect(master)
    lay = KVLayout(**W.LAYOUT)
    r = measure_aggregation(s, lay, 32, configs=((1, None), (16, 1)), repeats=1)
    assert [x["objects"] for x in r] == [32 * lay.num_layers, 2]
    assert all(x["save_s"] > 0 and x["load_s"] > 0 for x in r)
    s.close()
