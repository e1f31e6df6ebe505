"""A block KV cache on the pool: the engine's paged KV blocks as store objects.

Contract:
* A KVLayout (layers, tokens per block, kv heads, head dim, dtype, engine
  buffer order) and a Namespace (model, TP/PP rank and size, salt) give every
  cache a key prefix that also hashes the layout and the object format, so
  two models, ranks or layouts never share a key.
* Block keys are chained over token ids: hash(block i) = H(hash(block i-1),
  tokens of block i), rooted at the namespace. Equal hashes mean equal
  prefixes, so any request sharing a prefix finds the same blocks. Only full
  blocks get a hash.
* Aggregation: blocks are stored in aligned runs of `blocks_per_object`
  blocks (run r = blocks [rN, rN+N)), one object per run per layer group,
  keyed by the hash of the run's last block. A request's tail (fewer than N
  blocks) is a shorter object keyed by its own last block. One object holds
  [layer in group][K, V][block in run][tokens, heads, dim], so a load is one
  store read per object with a few large ranges (adjacent engine blocks are
  coalesced). blocks_per_object=1, layer_groups=num_layers is the
  one-object-per-block-per-layer baseline. The price: a request that shares
  only part of a stored run hits up to the run boundary before it (the same
  tokens, as in a PD hand-off, always hit every stored block).
* lookup() finds the longest cached prefix in one batch_is_exist (pass
  every full block: a run's object is keyed by its last block); save()
  copies once from the engine's registered buffers
  (batch_put_from_multi_buffers, one master round trip for the batch);
  load() copies once into them (batch_get_into_multi_buffers, or
  get_into_ranges for part of an object: its first blocks skipped or,
  with prefix.upto(n), only a prefix of a stored run); views() hands out
  pinned read-only views (get_buffer) instead.
* A stored object is never rewritten: save() skips objects that exist, and
  "already exists" from a racing writer of the same prefix counts as saved
  (same key, same bytes).
* Hold until consumed: save(..., hold=s) / hold() keep a request's objects
  from eviction (and unforced removes) for s seconds, also when the holder
  dies; the consumer's load(..., release=True) / release() ends the hold
  once it has the bytes. A hold is the objects' lease raised to the
  deadline (client_hold.cc): a released object stays only as long as a
  normal read's lease. Holds are not counted: a second holder of the same
  objects keeps a read lease's worth after the first releases.
* Write-back: a consumer extends the chain (block_hashes(new tokens,
  parent=hashes[-1])) and saves its new blocks with save(all hashes,
  engine blocks, start=blocks it loaded); the result is one prefix for
  every later request.
"""
import hashlib
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import ErrorCode

log = logging.getLogger("mooncake_cxl.kv")

# Storage dtypes: numpy has no bfloat16, so it is viewed as uint16 (same bytes).
_DTYPES = {"float16": np.float16, "bfloat16": np.uint16, "float32": np.float32, "float64": np.float64,
           "int8": np.int8, "uint8": np.uint8, "fp8": np.uint8, "float8_e4m3fn": np.uint8,
           "float8_e5m2": np.uint8}


class KVCacheError(RuntimeError):
    """A store call of the block cache failed; .code is the store's error code."""

    def __init__(self, what, code):
        super().__init__(f"{what}: store returned {code}")
        self.code = code


@dataclass(frozen=True)
class KVLayout:
    """The shape of one engine's KV cache.

    Engine buffers hold one array per layer, in one of two orders:
    'kv_first'    [2, num_blocks, block_tokens, num_kv_heads, head_dim] (vLLM CPU/flash)
    'block_first' [num_blocks, 2, block_tokens, num_kv_heads, head_dim]
    """
    num_layers: int
    block_tokens: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "float16"
    order: str = "kv_first"

    def __post_init__(self):
        for name in ("num_layers", "block_tokens", "num_kv_heads", "head_dim"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"KVLayout.{name} must be positive, got {getattr(self, name)!r}")
        if str(self.dtype) not in _DTYPES:
            raise ValueError(f"KVLayout.dtype {self.dtype!r} is not one of {sorted(_DTYPES)}")
        if self.order not in ("kv_first", "block_first"):
            raise ValueError(f"KVLayout.order must be 'kv_first' or 'block_first', got {self.order!r}")

    @property
    def np_dtype(self):
        return np.dtype(_DTYPES[str(self.dtype)])

    @property
    def half_block_bytes(self):
        """Bytes of one block's K (or V) in one layer."""
        return self.block_tokens * self.num_kv_heads * self.head_dim * self.np_dtype.itemsize

    @property
    def block_bytes(self):
        """Bytes of one block, K and V, all layers."""
        return 2 * self.half_block_bytes * self.num_layers

    def engine_shape(self, num_blocks):
        inner = (self.block_tokens, self.num_kv_heads, self.head_dim)
        return (2, num_blocks) + inner if self.order == "kv_first" else (num_blocks, 2) + inner

    def allocate(self, num_blocks):
        """Engine-style buffers (one zeroed array per layer), e.g. for tests and benchmarks."""
        return [np.zeros(self.engine_shape(num_blocks), dtype=self.np_dtype) for _ in range(self.num_layers)]

    def tag(self):
        return (f"L{self.num_layers}.T{self.block_tokens}.H{self.num_kv_heads}.D{self.head_dim}."
                f"{self.dtype}.{self.order}")


@dataclass(frozen=True)
class Namespace:
    """Who the blocks belong to: a model, a TP/PP shard, and an optional salt
    (e.g. a LoRA adapter or a cache generation). Part of every key."""
    model: str
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    salt: str = ""


def _digest(data, prev=b""):
    return hashlib.blake2b(prev + data, digest_size=16).digest()


@dataclass
class Prefix:
    """The result of lookup(): `blocks` leading blocks are cached, in `objects`
    (run start block, block count, key stem) tiling [0, blocks)."""
    blocks: int
    objects: list = field(default_factory=list)

    def upto(self, n):
        """The first min(n, blocks) blocks: what a caller may load when it
        must not take the whole prefix (vLLM recomputes a prompt's last
        token). Objects keep their full extent; load() copies only the
        blocks below .blocks out of the last one."""
        n = max(0, min(int(n), self.blocks))
        return Prefix(n, [o for o in self.objects if o[0] < n])


class BlockKVCache:
    """Block KV cache of one engine shard on a MooncakeDistributedStore."""

    def __init__(self, store, layout, namespace, blocks_per_object=16, layer_groups=1, config=None):
        if blocks_per_object < 1:
            raise ValueError("blocks_per_object must be >= 1")
        if not 1 <= layer_groups <= layout.num_layers:
            raise ValueError(f"layer_groups must be in 1..{layout.num_layers}")
        self.store = store
        self.layout = layout
        self.namespace = namespace
        self.blocks_per_object = int(blocks_per_object)
        self.layer_groups = int(layer_groups)
        self.config = config
        # Layers of each group: contiguous, as even as possible.
        n, g = layout.num_layers, self.layer_groups
        bounds = [i * n // g for i in range(g + 1)]
        self.groups = [list(range(bounds[i], bounds[i + 1])) for i in range(g)]
        ns = namespace
        ident = (f"{ns.model}|tp{ns.tp_rank}/{ns.tp_size}|pp{ns.pp_rank}/{ns.pp_size}|{ns.salt}|"
                 f"{layout.tag()}|N{self.blocks_per_object}|G{self.layer_groups}")
        self.root = _digest(ident.encode())
        model_tag = "".join(c if c.isalnum() or c in "-_." else "_" for c in ns.model)[:64]
        self.prefix = f"mcxl-kv/{model_tag}/{self.root.hex()}"
        self._buffers = None  # per layer: (base pointer, num_blocks)
        self._registered = []

    # ---------------------------------------------------------------- keys

    def block_hashes(self, token_ids, parent=None):
        """Chained hashes (bytes) of the full blocks of `token_ids`; `parent` is the
        hash of the block before token_ids[0] (None: token_ids starts the sequence)."""
        t = np.ascontiguousarray(np.asarray(token_ids, dtype=np.int64))
        bt = self.layout.block_tokens
        prev = self.root if parent is None else parent
        out = []
        for i in range(len(t) // bt):
            prev = _digest(t[i * bt:(i + 1) * bt].tobytes(), prev)
            out.append(prev)
        return out

    def _stem(self, h):
        return f"{self.prefix}/{h.hex()}"

    def _key(self, stem, group):
        return f"{stem}/g{group}"

    def _runs(self, n):
        """Aligned runs (start, count) tiling [0, n)."""
        N = self.blocks_per_object
        return [(s, min(N, n - s)) for s in range(0, n, N)]

    # ------------------------------------------------------------- lookup

    def lookup(self, hashes):
        """The longest cached prefix of a request's block hashes, in one
        batch_is_exist over every block's possible object (all groups)."""
        hashes = list(hashes)
        n = len(hashes)
        if n == 0:
            return Prefix(0)
        G = self.layer_groups
        keys = [self._key(self._stem(h), g) for h in hashes for g in range(G)]
        rc = self.store.batch_is_exist(keys)
        present = [all(rc[i * G + g] == 1 for g in range(G)) for i in range(n)]
        N = self.blocks_per_object
        objects, covered = [], 0
        for start in range(0, n, N):
            end = min(start + N, n)
            # The longest object starting at `start` within this request: the
            # full run, or a tail some earlier request stored.
            last = next((i for i in range(end - 1, start - 1, -1) if present[i]), None)
            if last is None:
                break
            objects.append((start, last - start + 1, self._stem(hashes[last])))
            covered = last + 1
            if last != start + N - 1:
                break  # a tail: nothing is stored after it in this run's alignment
        return Prefix(covered, objects)

    # ------------------------------------------------------------ buffers

    def register(self, layer_buffers):
        """Registers the engine's per-layer KV buffers (numpy arrays, torch
        tensors, or (pointer, nbytes) pairs) with the store; all layers must
        have layout.engine_shape(num_blocks)."""
        if len(layer_buffers) != self.layout.num_layers:
            raise ValueError(f"register: {len(layer_buffers)} layer buffers for {self.layout.num_layers} layers")
        bufs = []
        per_block = 2 * self.layout.half_block_bytes
        for i, b in enumerate(layer_buffers):
            ptr, nbytes = _pointer(b)
            if nbytes % per_block:
                raise ValueError(f"register: layer {i} holds {nbytes} bytes, not a whole number of "
                                 f"{per_block}-byte blocks")
            bufs.append((ptr, nbytes // per_block, nbytes))
        # Register each contiguous span once (vLLM's cache is often one allocation).
        spans = sorted((p, p + n) for p, _, n in bufs)
        merged = []
        for lo, hi in spans:
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        for lo, hi in merged:
            rc = self.store.register_buffer(lo, hi - lo)
            if rc != 0:
                raise KVCacheError("register_buffer", rc)
            self._registered.append(lo)
        self._buffers = [(p, nb) for p, nb, _ in bufs]
        self._keep = list(layer_buffers)  # the memory must outlive the registration

    def unregister(self):
        for p in self._registered:
            self.store.unregister_buffer(p)
        self._registered, self._buffers, self._keep = [], None, []

    def _addr(self, layer, kv, block):
        base, nb = self._buffers[layer]
        if not 0 <= block < nb:
            raise IndexError(f"engine block {block} out of range 0..{nb - 1}")
        hb = self.layout.half_block_bytes
        if self.layout.order == "kv_first":
            return base + (kv * nb + block) * hb
        return base + (block * 2 + kv) * hb

    def _ranges(self, group, engine_blocks):
        """(ptrs, sizes) of one object's value in engine memory, in value order,
        adjacent ranges coalesced."""
        hb = self.layout.half_block_bytes
        ptrs, sizes = [], []
        for layer in self.groups[group]:
            for kv in (0, 1):
                for b in engine_blocks:
                    a = self._addr(layer, kv, b)
                    if ptrs and ptrs[-1] + sizes[-1] == a:
                        sizes[-1] += hb
                    else:
                        ptrs.append(a)
                        sizes.append(hb)
        return ptrs, sizes

    def _need_buffers(self, what):
        if self._buffers is None:
            raise RuntimeError(f"{what}: call register() with the engine's KV buffers first")

    def stored_prefix(self, hashes, end=None):
        """The Prefix a save of hashes[:end] leaves in the store (aligned runs,
        the tail keyed by its last block), without asking the store: what a
        consumer told "blocks [0, end) are stored" loads."""
        hashes = list(hashes)
        end = len(hashes) if end is None else int(end)
        if not 0 <= end <= len(hashes):
            raise ValueError(f"stored_prefix: end {end} outside 0..{len(hashes)}")
        return Prefix(end, [(s, c, self._stem(hashes[s + c - 1])) for s, c in self._runs(end)])

    # -------------------------------------------------------------- holds

    def _prefix_keys(self, prefix, start=0, groups=None):
        gs = range(self.layer_groups) if groups is None else groups
        return [self._key(stem, g) for s, c, stem in prefix.objects if s + c > start for g in gs]

    def hold(self, what, seconds, start=0, groups=None):
        """Keeps the objects of `what` (a Prefix, or a request's block hashes:
        the objects a save of them writes) whose blocks reach past `start`
        (of these layer groups, default all) from eviction and unforced
        removes for `seconds` (at most an hour). Returns the number of
        objects held (missing ones are not)."""
        prefix = what if isinstance(what, Prefix) else self.stored_prefix(what)
        keys = self._prefix_keys(prefix, start, groups)
        if not keys:
            return 0
        until = time.time_ns() + int(max(0.0, float(seconds)) * 1e9)
        return sum(1 for r in self.store._hold(keys, until) if r == 0)

    def release(self, prefix, start=0):
        """Ends the hold of a Prefix's objects reaching past block `start`
        (they keep a read lease). Returns the number of objects found."""
        keys = self._prefix_keys(prefix, start)
        return sum(1 for r in self.store._release_hold(keys) if r == 0) if keys else 0

    # --------------------------------------------------------------- save

    def save(self, hashes, engine_blocks, start=0, hold=None, groups=None):
        """Stores the blocks of a request (hashes[i] lives in engine block
        engine_blocks[i]) as aligned run objects, skipping those already stored
        and those entirely before block `start`. Returns the number of objects
        written. One batch_put_from_multi_buffers for all of them.
        hold: seconds to hold every object of blocks [start, n), written now
        or stored before (see hold()), for a consumer that will load them.
        groups: only these layer groups (default all), e.g. one layer group
        as soon as the engine has computed it (layer-wise save)."""
        self._need_buffers("save")
        hashes = list(hashes)
        engine_blocks = list(engine_blocks)
        if len(engine_blocks) < len(hashes):
            raise ValueError(f"save: {len(hashes)} blocks but {len(engine_blocks)} engine block ids")
        gs = list(range(self.layer_groups)) if groups is None else sorted(set(int(g) for g in groups))
        if any(not 0 <= g < self.layer_groups for g in gs):
            raise ValueError(f"save: layer groups {gs} outside 0..{self.layer_groups - 1}")
        candidates = [(s, c) for s, c in self._runs(len(hashes)) if s + c > start]
        keys = [self._key(self._stem(hashes[s + c - 1]), g) for s, c in candidates for g in gs]
        if not keys:
            return 0
        try:
            return self._save(keys, candidates, engine_blocks, gs)
        finally:
            if hold is not None:
                self.hold(hashes, hold, start=start, groups=gs)

    def _save(self, keys, candidates, engine_blocks, gs):
        G = len(gs)
        exist = self.store.batch_is_exist(keys)
        put_keys, all_ptrs, all_sizes = [], [], []
        for j, (s, c) in enumerate(candidates):
            for gi, g in enumerate(gs):
                k = j * G + gi
                if exist[k] == 1:
                    continue
                p, z = self._ranges(g, engine_blocks[s:s + c])
                put_keys.append(keys[k])
                all_ptrs.append(p)
                all_sizes.append(z)
        if not put_keys:
            return 0
        args = (put_keys, all_ptrs, all_sizes) + ((self.config,) if self.config is not None else ())
        rc = self.store.batch_put_from_multi_buffers(*args)
        written = 0
        for key, r in zip(put_keys, rc):
            if r == 0:
                written += 1
            elif r != ErrorCode.OBJECT_ALREADY_EXISTS:  # a racing writer of the same prefix: same bytes
                raise KVCacheError(f"save of {key}", r)
        return written

    # --------------------------------------------------------------- load

    def load(self, prefix, engine_blocks, start=0, release=False, groups=None):
        """Copies blocks [start, prefix.blocks) of a lookup() result into the
        engine blocks engine_blocks[i] (indexed by request block); an object
        reaching past prefix.blocks (Prefix.upto) is read only up to it, into
        no more engine blocks than that, still one copy. Returns the
        number of blocks loaded; raises KVCacheError if an object vanished
        (evicted between lookup and load: the caller recomputes).
        release: end the objects' hold once loaded (see hold()); groups: only
        these layer groups (default all)."""
        self._need_buffers("load")
        sel = range(self.layer_groups) if groups is None else sorted(set(int(g) for g in groups))
        if any(not 0 <= g < self.layer_groups for g in sel):
            raise ValueError(f"load: layer groups {list(sel)} outside 0..{self.layer_groups - 1}")
        engine_blocks = list(engine_blocks)
        if len(engine_blocks) < prefix.blocks:
            raise ValueError(f"load: {prefix.blocks} blocks but {len(engine_blocks)} engine block ids")
        hb = self.layout.half_block_bytes
        end = prefix.blocks
        whole_keys, whole_ptrs, whole_sizes = [], [], []
        part_keys, part_dst, part_src, part_sizes = [], [], [], []
        for s, c, stem in prefix.objects:
            if s + c <= start or s >= end:
                continue
            lo, hi = max(0, start - s), min(c, end - s)  # the object's blocks to copy
            for g in sel:
                key = self._key(stem, g)
                if lo == 0 and hi == c:
                    p, z = self._ranges(g, engine_blocks[s:s + c])
                    whole_keys.append(key)
                    whole_ptrs.append(p)
                    whole_sizes.append(z)
                    continue
                # Part of the object: blocks [lo, hi) of each (layer, K/V) row.
                dst, src = [], []
                for li, layer in enumerate(self.groups[g]):
                    for kv in (0, 1):
                        for b in range(lo, hi):
                            src.append(((li * 2 + kv) * c + b) * hb)
                            dst.append(self._addr(layer, kv, engine_blocks[s + b]))
                part_keys.append(key)
                part_dst.append(dst)
                part_src.append(src)
                part_sizes.append([hb] * len(dst))
        if part_keys:
            # Destinations as absolute addresses (base 0): each is checked
            # against the registered buffers by the store.
            rc = self.store.get_into_ranges([0], [part_keys], [part_dst], [part_src], [part_sizes])
            for key, got in zip(part_keys, rc[0]):
                if any(r != hb for r in got):
                    raise KVCacheError(f"load of {key}", next(r for r in got if r != hb))
        if whole_keys:
            rc = self.store.batch_get_into_multi_buffers(whole_keys, whole_ptrs, whole_sizes)
            for key, z, r in zip(whole_keys, whole_sizes, rc):
                if r != sum(z):
                    raise KVCacheError(f"load of {key}", r)
        if release:
            keys = part_keys + whole_keys
            if keys:
                self.store._release_hold(keys)
        return max(0, prefix.blocks - start)

    def views(self, prefix):
        """Pinned read-only views of a lookup() result, no copy: a list of
        (run start, count, group, handle, array) with array shaped
        [layers in group, 2, count, block_tokens, kv heads, head dim]. Each
        handle pins its object until it is dropped."""
        L = self.layout
        out = []
        for s, c, stem in prefix.objects:
            for g in range(self.layer_groups):
                key = self._key(stem, g)
                h = self.store.get_buffer(key)
                if h is None:
                    raise KVCacheError(f"get_buffer of {key}", ErrorCode.OBJECT_NOT_FOUND)
                arr = np.frombuffer(h, dtype=L.np_dtype).reshape(
                    len(self.groups[g]), 2, c, L.block_tokens, L.num_kv_heads, L.head_dim)
                out.append((s, c, g, h, arr))
        return out

    def remove(self, prefix, force=False):
        """Removes a lookup() result's objects; returns how many were removed."""
        keys = [self._key(stem, g) for _, _, stem in prefix.objects for g in range(self.layer_groups)]
        return sum(1 for r in self.store.batch_remove(keys, force=force) if r == 0) if keys else 0


def _pointer(buf):
    """(address, nbytes) of a contiguous numpy array, torch tensor or (ptr, nbytes) pair."""
    if isinstance(buf, tuple) and len(buf) == 2:
        return int(buf[0]), int(buf[1])
    if hasattr(buf, "data_ptr") and hasattr(buf, "element_size"):  # torch, without importing it
        if not buf.is_contiguous():
            raise ValueError("register: a KV buffer must be contiguous")
        return int(buf.data_ptr()), int(buf.numel() * buf.element_size())
    a = np.asarray(buf)
    if not a.flags["C_CONTIGUOUS"]:
        raise ValueError("register: a KV buffer must be C-contiguous")
    return int(a.ctypes.data), int(a.nbytes)
