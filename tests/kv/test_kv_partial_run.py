"""mooncake_cxl.kv: loading a prefix of a stored run. A prefill process saves
8 blocks as two aligned runs of 4 (each object keyed by its run's last
block); the consumer looks up every full block, so it finds both runs, then
loads only Prefix.upto(7) (vLLM recomputes a prompt's last token when the
prompt ends on a run boundary) into 7 engine blocks: every byte checked, no
engine block past them written, one store read per kind (the partial run
through get_into_ranges straight into the engine: one copy)."""
import kv_workers as W
from conftest import connect


class Counting:
    """The store, counting the read calls the cache makes."""

    def __init__(self, store):
        self._s, self.calls = store, {}

    def __getattr__(self, name):
        f = getattr(self._s, name)
        if name not in ("get_into_ranges", "batch_get_into_multi_buffers"):
            return f

        def counted(*a, **k):
            self.calls[name] = self.calls.get(name, 0) + 1
            return f(*a, **k)
        return counted


def test_load_prefix_of_stored_run(master, children):
    n_obj, groups = 4, 2
    bt = W.LAYOUT["block_tokens"]
    p = children(W.prefill, master.address, n_obj, groups, 11, 8 * bt).result()
    assert p["blocks"] == 8 and p["written"] == 2 * groups
    s = connect(master)
    cache = W.make_cache(s, n_obj, groups)
    hashes = cache.block_hashes(W.tokens(11, 8 * bt))
    assert cache.lookup(hashes[:7]).blocks == 4  # the old consumer's lookup: one block short misses run 1
    full = cache.lookup(hashes)
    assert full.blocks == 8 and [(a, b) for a, b, _ in full.objects] == [(0, 4), (4, 4)]
    buf = cache.layout.allocate(16)
    cache.register(buf)
    cache.store = counting = Counting(s)

    def zero():
        for a in buf:
            a[...] = 0
        counting.calls.clear()


    # The whole first run plus blocks 0..2 of the second, into 7 engine blocks only.
    seven = [15, 3, 9, 10, 0, 14, 6]
    zero()
    pre = full.upto(7)
    assert pre.blocks == 7 and len(pre.objects) == 2
    assert cache.load(pre, seven) == 7
    assert W.check_engine(cache, buf, hashes[:7], seven) == 0
    assert not any(a[:, [b for b in range(16) if b not in seven]].any() for a in buf)
    assert counting.calls == {"batch_get_into_multi_buffers": 1, "get_into_ranges": 1}, counting.calls
    # Both ends cut inside one object: blocks 5..6 of run 1, read as ranges only.
    zero()
    assert cache.load(pre, seven, start=5) == 2
    assert W.check_engine(cache, buf, hashes[5:7], seven[5:7]) == 0
    assert not any(a[:, [b for b in range(16) if b not in seven[5:7]]].any() for a in buf)
    assert counting.calls == {"get_into_ranges": 1}, counting.calls
    # Inside the first run, skipping its first block: the second run is not read.
    zero()
    assert cache.load(full.upto(3), [1, 2, 4], start=1) == 2
    assert W.check_engine(cache, buf, hashes[1:3], [2, 4]) == 0
    assert not any(a[:, [b for b in range(16) if b not in (2, 4)]].any() for a in buf)
    assert counting.calls == {"get_into_ranges": 1}, counting.calls
    # upto past the prefix changes nothing; upto(0) loads nothing.
    assert full.upto(99) == full and full.upto(0).blocks == 0 and full.upto(0).objects == []
    zero()
    assert cache.load(full.upto(0), []) == 0 and counting.calls == {}
    s.close()
