"""The tensor methods of MooncakeDistributedStore (put_tensor, get_tensor,
their batch, _into, _from, pub, upsert, _with_tp and _with_parallelism forms),
mixed into the store as TensorMethods.

Objects are in Mooncake 0.3.13's tensor format (tensor_codec), so a tensor put
by either client reads back in the other; shards are stored under Mooncake's
keys (tensor_parallelism). TP shards (`K_tp_R` for rank R) are split along
`split_dim` into equal parts (an uneven split is refused, as in 0.3.13).

torch is an optional dependency (`pip install .[torch]`); without it the
tensor methods log why and return Mooncake's error shapes.

The names of the format and of the parallelism specs are importable from
here too (from mooncake_cxl.tensor import ParallelAxis, parse_meta, ...).
"""
import ctypes
import logging

from .errors import ErrorCode
from .tensor_codec import (HEADER_SIZE, MANIFEST_SIZE, TP, TensorMeta, canonical_axes, check_tensor,
                           dtype_tables, pack_manifest, pack_meta, parse_manifest, parse_meta, tensor_at,
                           tensor_parts, torch_module)
from .tensor_parallelism import (ParallelAxis, ReadTarget, TensorParallelism, parallelism_key, parse_axes,
                                 with_tp_rank, writer_manifest_key, writer_shard_key)

__all__ = ["TensorMethods", "ParallelAxis", "TensorParallelism", "ReadTarget", "TensorMeta", "HEADER_SIZE",
           "pack_meta", "parse_meta", "tensor_parts", "tensor_at", "torch_module"]

log = logging.getLogger("mooncake_cxl")

INVALID = int(ErrorCode.INVALID_PARAMS)
NOT_SUPPORTED = int(ErrorCode.NOT_SUPPORTED)


# ---------------------------------------------------------------- caller memory and arguments

def _memory_at(ptr, size):
    return (ctypes.c_uint8 * size).from_address(ptr)


def _meta_at(ptr, size, op):
    """TensorMeta of a tensor object at caller memory `ptr`, or None (logged)."""
    if not ptr or size < HEADER_SIZE:
        log.error("%s: buffer of %d bytes at %#x cannot hold a tensor object", op, size, ptr)
        return None
    meta, why = parse_meta(ctypes.string_at(ptr, HEADER_SIZE), size)
    if meta is None:
        log.error("%s: invalid tensor object in the buffer: %s", op, why)
    return meta


def _buffer_of(ptr, size):
    """(pointer, size) of caller memory given as an int or as a CPU tensor."""
    torch = torch_module()
    if torch is not None and isinstance(ptr, torch.Tensor):
        t = ptr
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError("a destination tensor must be a contiguous CPU tensor")
        n = t.numel() * t.element_size()
        return t.data_ptr(), n if size is None else min(size, n)
    if size is None:
        raise TypeError("size is required with an integer buffer_ptr")
    return int(ptr), int(size)


def _shards(tensor, tp_size, split_dim, op, key):
    """Equal contiguous shards of `tensor` along split_dim, or None (logged)."""
    if tensor is None:
        return None
    if not 0 <= split_dim < tensor.dim():
        log.error("%s(%r): split_dim %d out of range for a %d-d tensor", op, key, split_dim,
                  tensor.dim())
        return None
    extent = tensor.shape[split_dim]
    if tp_size <= 0 or extent % tp_size:
        log.error("%s(%r): only uniform sharding is supported: dim %d of size %d into %d shards",
                  op, key, split_dim, extent, tp_size)
        return None
    n = extent // tp_size
    return [tensor.narrow(split_dim, r * n, n) for r in range(tp_size)]


def _valid_config(config, op):
    """Mooncake's validate_replicate_config for the pub_* forms."""
    segs = getattr(config, "preferred_segments", None) or []
    if segs and len(segs) != getattr(config, "replica_num", 1):
        log.error("%s: %d preferred segments must match replica_num %d", op, len(segs),
                  config.replica_num)
        return False
    return True


# ---------------------------------------------------------------- the methods

class TensorMethods:
    """Mixed into MooncakeDistributedStore (which supplies put_parts,
    batch_put_from_multi_buffers, get_buffer, get_into, ...)."""

    # -- writes --

    def _write_parts(self, keys, parts, config, upsert):
        """Stores prepared TensorParts (None entries are -600): one master round trip."""
        from ._core import ReplicateConfig
        config = ReplicateConfig() if config is None else config
        out = [INVALID] * len(keys)
        idx = [i for i, p in enumerate(parts) if p is not None]
        if not idx:
            return out
        bufs = [parts[i].buffers() for i in idx]
        call = self._batch_upsert_from_multi_buffers if upsert else self.batch_put_from_multi_buffers
        rs = call([keys[i] for i in idx], [b[0] for b in bufs], [b[1] for b in bufs], config)
        for i, r in zip(idx, rs):
            out[i] = r
        return out

    def _put_tensors(self, keys, tensors, config, upsert, op):
        keys = list(keys)
        tensors = list(tensors)
        if len(keys) != len(tensors):
            log.error("%s: %d keys but %d tensors", op, len(keys), len(tensors))
            return [INVALID] * len(keys)
        parts = [tensor_parts(t, op, k) for k, t in zip(keys, tensors)]
        return self._write_parts(keys, parts, config, upsert)

    def _put_tp(self, keys, tensors, config, tp_size, split_dim, upsert, op, axes_of=None):
        """Every TP shard of every tensor in one batch; per key 0 or its first error."""
        all_keys, all_parts, spans = [], [], []
        out = [INVALID] * len(keys)
        torch = torch_module()
        for i, (key, t) in enumerate(zip(keys, tensors)):
            t = check_tensor(torch, t, op, key)
            shards = _shards(t, tp_size, split_dim, op, key)
            if shards is None:
                continue
            start = len(all_keys)
            for rank, shard in enumerate(shards):
                if axes_of is None:
                    axes = [(TP, rank, tp_size, split_dim, 0, shard.shape[split_dim])]
                    skey = f"{key}_tp_{rank}"
                else:
                    axes, skey = axes_of(key, rank, shard)
                all_keys.append(skey)
                all_parts.append(tensor_parts(shard, op, skey, t.shape, axes))
            spans.append((i, start, len(all_keys)))
        rs = self._write_parts(all_keys, all_parts, config, upsert)
        for i, a, b in spans:
            out[i] = next((r for r in rs[a:b] if r != 0), 0)
        return out

    def put_tensor(self, key, tensor):
        """Put a PyTorch tensor (Mooncake's tensor object format)."""
        return self._put_tensors([key], [tensor], None, False, "put_tensor")[0]

    def upsert_tensor(self, key, tensor):
        """Upsert a PyTorch tensor (insert or replace)."""
        return self._put_tensors([key], [tensor], None, True, "upsert_tensor")[0]

    def pub_tensor(self, key, tensor, config=None):
        """put_tensor with a ReplicateConfig (pins, groups, ...)."""
        if config is not None and not _valid_config(config, "pub_tensor"):
            return INVALID
        return self._put_tensors([key], [tensor], config, False, "pub_tensor")[0]

    def upsert_pub_tensor(self, key, tensor, config=None):
        if config is not None and not _valid_config(config, "upsert_pub_tensor"):
            return INVALID
        return self._put_tensors([key], [tensor], config, True, "upsert_pub_tensor")[0]

    def _batch_write(self, keys, tensors_list, config, upsert, op):
        keys, tensors_list = list(keys), list(tensors_list)
        if not keys:
            return []
        if config is not None and not _valid_config(config, op):
            return [INVALID] * len(keys)
        return self._put_tensors(keys, tensors_list, config, upsert, op)

    def batch_put_tensor(self, keys, tensors_list):
        """Put many tensors: one master round trip."""
        return self._batch_write(keys, tensors_list, None, False, "batch_put_tensor")

    def batch_upsert_tensor(self, keys, tensors_list):
        return self._batch_write(keys, tensors_list, None, True, "batch_upsert_tensor")

    def batch_pub_tensor(self, keys, tensors_list, config=None):
        return self._batch_write(keys, tensors_list, config, False, "batch_pub_tensor")

    def batch_upsert_pub_tensor(self, keys, tensors_list, config=None):
        return self._batch_write(keys, tensors_list, config, True, "batch_upsert_pub_tensor")

    # -- TP writes --

    def put_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0):
        """Store tp_size equal shards of `tensor` along split_dim under key_tp_<rank>
        (every rank's shard, as Mooncake does; tp_rank is not used)."""
        if tp_size <= 1:
            return self.put_tensor(key, tensor)
        return self._put_tp([key], [tensor], None, tp_size, split_dim, False, "put_tensor_with_tp")[0]

    def pub_tensor_with_tp(self, key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0):
        if config is not None and not _valid_config(config, "pub_tensor_with_tp"):
            return INVALID
        if tp_size <= 1:
            return self._put_tensors([key], [tensor], config, False, "pub_tensor_with_tp")[0]
        return self._put_tp([key], [tensor], config, tp_size, split_dim, False, "pub_tensor_with_tp")[0]

    def batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1, split_dim=0):
        if tp_size <= 1:
            return self.batch_put_tensor(base_keys, tensors_list)
        return self._batch_tp(base_keys, tensors_list, None, tp_size, split_dim, "batch_put_tensor_with_tp")

    def batch_pub_tensor_with_tp(self, base_keys, tensors_list, config=None, tp_rank=0, tp_size=1,
                                 split_dim=0):
        if tp_size <= 1:
            return self.batch_pub_tensor(base_keys, tensors_list, config)
        return self._batch_tp(base_keys, tensors_list, config, tp_size, split_dim, "batch_pub_tensor_with_tp")

    def _batch_tp(self, keys, tensors, config, tp_size, split_dim, op):
        keys, tensors = list(keys), list(tensors)
        if not keys:
            return []
        if len(keys) != len(tensors):
            log.error("%s: %d keys but %d tensors", op, len(keys), len(tensors))
            return [INVALID] * len(keys)
        if config is not None and not _valid_config(config, op):
            return [INVALID] * len(keys)
        return self._put_tp(keys, tensors, config, tp_size, split_dim, False, op)

    # -- writes from caller buffers holding a tensor object --

    def _from_buffers(self, keys, ptrs, sizes, upsert, op, batch):
        keys, ptrs, sizes = list(keys), list(ptrs), list(sizes)
        if batch and not keys:
            return []
        if not (len(keys) == len(ptrs) == len(sizes)):
            log.error("%s: %d keys, %d buffers, %d sizes", op, len(keys), len(ptrs), len(sizes))
            return [INVALID] * len(keys)
        if any(_meta_at(p, n, op) is None for p, n in zip(ptrs, sizes)):
            return [INVALID] * len(keys)
        call = self.batch_upsert_from if upsert else self.batch_put_from
        return call(keys, ptrs, sizes)

    def put_tensor_from(self, key, buffer_ptr, size):
        """Put a tensor object ([TensorMetadata][data], as get_tensor_into leaves it) from caller memory."""
        return self._from_buffers([key], [buffer_ptr], [size], False, "put_tensor_from", False)[0]

    def upsert_tensor_from(self, key, buffer_ptr, size):
        return self._from_buffers([key], [buffer_ptr], [size], True, "upsert_tensor_from", False)[0]

    def batch_put_tensor_from(self, keys, buffer_ptrs, sizes):
        return self._from_buffers(keys, buffer_ptrs, sizes, False, "batch_put_tensor_from", True)

    def batch_upsert_tensor_from(self, keys, buffer_ptrs, sizes):
        return self._from_buffers(keys, buffer_ptrs, sizes, True, "batch_upsert_tensor_from", True)

    def _decode_at(self, ptr, size, op):
        """A tensor aliasing the tensor object at caller memory, or None."""
        if _meta_at(ptr, size, op) is None:
            return None
        return tensor_at(ptr, size, op, "", copy=False, owner=_memory_at(ptr, size))

    def put_tensor_with_tp_from(self, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
        """Split the full tensor object in caller memory into key_tp_<rank> shards."""
        t = self._decode_at(buffer_ptr, size, "put_tensor_with_tp_from")
        if t is None:
            return INVALID
        if tp_size <= 1:
            return self.put_tensor_from(key, buffer_ptr, size)
        return self._put_tp([key], [t], None, tp_size, split_dim, False, "put_tensor_with_tp_from")[0]

    def batch_put_tensor_with_tp_from(self, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1,
                                      split_dim=0):
        if tp_size <= 1:
            return self.batch_put_tensor_from(base_keys, buffer_ptrs, sizes)
        base_keys, buffer_ptrs, sizes = list(base_keys), list(buffer_ptrs), list(sizes)
        if not (len(base_keys) == len(buffer_ptrs) == len(sizes)):
            log.error("batch_put_tensor_with_tp_from: %d keys, %d buffers, %d sizes",
                      len(base_keys), len(buffer_ptrs), len(sizes))
            return [INVALID] * len(base_keys)
        ts = [self._decode_at(p, n, "batch_put_tensor_with_tp_from") for p, n in zip(buffer_ptrs, sizes)]
        return self._put_tp(base_keys, ts, None, tp_size, split_dim, False, "batch_put_tensor_with_tp_from")

    # -- reads --

    def get_tensor(self, key, *, view=False):
        """The tensor stored under `key`, or None. No master round trip.

        view=True (ours): no copy at all; the tensor views the pool and pins the
        object (it cannot be evicted or removed) while the tensor or any view of
        it is alive. Such a tensor must not be written to."""
        h = self.get_buffer(key)
        if h is None:
            return None
        return tensor_at(h.ptr(), len(h), "get_tensor", key, copy=not view, owner=h)

    def batch_get_tensor(self, keys, *, view=False):
        """get_tensor of each key (None where missing): no master round trip."""
        out = []
        for key, h in zip(keys, self.batch_get_buffer(list(keys))):
            out.append(None if h is None else
                       tensor_at(h.ptr(), len(h), "batch_get_tensor", key, copy=not view, owner=h))
        return out

    def _tensor_at(self, key, ptr, n, op):
        if n < 0:
            log.error("%s(%r): read failed with %d (nothing written when the buffer is too small)",
                      op, key, n)
            return None
        return tensor_at(ptr, n, op, key, copy=False, owner=_memory_at(ptr, n)) if n else None

    def get_tensor_into(self, key, buffer_ptr, size=None):
        """Read `key`'s tensor object into caller memory (one copy, pool to
        buffer) and return a tensor viewing it (at buffer_ptr + 304), or None.
        buffer_ptr may also be a contiguous CPU torch tensor (ours). A buffer
        too small for the object: None, a log line, and nothing written."""
        ptr, size = _buffer_of(buffer_ptr, size)
        return self._tensor_at(key, ptr, self.get_into(key, ptr, size), "get_tensor_into")

    def batch_get_tensor_into(self, keys, buffer_ptrs, sizes):
        """get_tensor_into for each key (None where it failed): no master round trip."""
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        if not (len(keys) == len(buffer_ptrs) == len(sizes)):
            log.error("batch_get_tensor_into: %d keys, %d buffers, %d sizes", len(keys),
                      len(buffer_ptrs), len(sizes))
            return [INVALID] * len(keys)
        rs = self.batch_get_into(keys, buffer_ptrs, sizes)
        return [self._tensor_at(k, p, n, "batch_get_tensor_into") for k, p, n in zip(keys, buffer_ptrs, rs)]

    def _meta_of(self, key):
        """TensorMeta of a stored object (a pin, no copy), or None."""
        h = self.get_buffer(key)
        if h is None:
            return None
        meta, why = parse_meta(bytes(memoryview(h)[:HEADER_SIZE]), len(h))
        if meta is None:
            log.error("%r: invalid tensor object: %s", key, why)
        return meta

    def _tp_read_key(self, key, tp_rank, tp_size, op):
        """The key holding rank tp_rank's shard (checked against its header), or None."""
        if tp_size <= 1:
            return key
        read_key = f"{key}_tp_{tp_rank}"
        meta = self._meta_of(read_key)
        if meta is None:
            return None
        ax = meta.axis(TP)
        if not meta.is_shard or ax is None or ax[1] != tp_rank:
            log.error("%s: TP metadata mismatch for key %r", op, read_key)
            return None
        return read_key

    def get_tensor_with_tp(self, key, tp_rank=0, tp_size=1, split_dim=0):
        """Rank tp_rank's shard (key_tp_<rank>); the whole tensor when tp_size <= 1."""
        read_key = self._tp_read_key(key, tp_rank, tp_size, "get_tensor_with_tp")
        return None if read_key is None else self.get_tensor(read_key)

    def batch_get_tensor_with_tp(self, base_keys, tp_rank=0, tp_size=1):
        return [self.get_tensor_with_tp(k, tp_rank, tp_size) for k in base_keys]

    def get_tensor_with_tp_into(self, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
        read_key = self._tp_read_key(key, tp_rank, tp_size, "get_tensor_with_tp_into")
        return None if read_key is None else self.get_tensor_into(read_key, buffer_ptr, size)

    def batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1):
        base_keys, buffer_ptrs, sizes = list(base_keys), list(buffer_ptrs), list(sizes)
        if not (len(base_keys) == len(buffer_ptrs) == len(sizes)):
            log.error("batch_get_tensor_with_tp_into: %d keys, %d buffers, %d sizes",
                      len(base_keys), len(buffer_ptrs), len(sizes))
            return [None] * len(base_keys)
        read = [self._tp_read_key(k, tp_rank, tp_size, "batch_get_tensor_with_tp_into") for k in base_keys]
        ok = [i for i, k in enumerate(read) if k is not None]
        got = self.batch_get_tensor_into([read[i] for i in ok], [buffer_ptrs[i] for i in ok],
                                         [sizes[i] for i in ok]) if ok else []
        out = [None] * len(base_keys)
        for i, t in zip(ok, got):
            out[i] = t
        return out

    # -- parallelism (TensorParallelism / writer partitions / ReadTarget) --

    def _parallel_write(self, key, tensor, parallelism, config, writer_partition, upsert, op,
                        from_buffer=False):
        """The routes of Mooncake 0.3.13's put_tensor_with_parallelism, as its
        store behaves (tests/compat/test_conformance.py checks the keys and bytes):
        a writer partition or a multi-axis TP request stores the calling
        rank's shard of the full tensor; a single TP axis takes `tensor` as
        that rank's shard already (global shape = its shape × size along
        split_dim); DP/EP/PP stores the tensor as it is under its shard key.
        The _from forms (from_buffer) store every TP rank's shard instead."""
        if writer_partition is not None and parallelism is not None:
            log.error("%s: writer_partition cannot be combined with parallelism", op)
            return INVALID
        if writer_partition is not None:
            return self._writer_write(key, tensor, writer_partition, config, upsert, op)
        if parallelism is None:
            if config is not None and not _valid_config(config, op):
                return INVALID
            return self._put_tensors([key], [tensor], config, upsert, op)[0]
        axes = parse_axes(parallelism, op)
        if axes is None:
            return INVALID
        t = check_tensor(torch_module(), tensor, op, key)
        if t is None:
            return INVALID
        tp = next((a for a in axes if a[0] == TP), None)

        def header(mine, local):
            return [(k, r, s, -1 if d is None else d, i or 0, local[d] if d is not None else 0)
                    for k, r, s, d, i in mine]
        if tp is not None and tp[3] >= t.dim():
            log.error("%s(%r): split_dim %d out of range for a %d-d tensor", op, key, tp[3], t.dim())
            return INVALID
        if tp is None or (len(axes) == 1 and not from_buffer):
            # as it is: the caller's shard (DP/EP/PP, or this TP rank's shard)
            full = list(t.shape)
            if tp is not None:
                full[tp[3]] *= tp[2]
            skey = parallelism_key(key, axes)
            parts = tensor_parts(t, op, skey, full, header(axes, t.shape))
            return self._write_parts([skey], [parts], config, upsert)[0]

        def axes_of(base, rank, shard):
            mine = with_tp_rank(axes, rank)
            return header(mine, shard.shape), parallelism_key(base, mine)
        if from_buffer:  # every TP rank's shard
            return self._put_tp([key], [t], config, tp[2], tp[3], upsert, op, axes_of)[0]
        shards = _shards(t, tp[2], tp[3], op, key)  # only the calling rank's shard
        if shards is None:
            return INVALID
        hdr, skey = axes_of(key, tp[1], shards[tp[1]])
        return self._write_parts([skey], [tensor_parts(shards[tp[1]], op, skey, t.shape, hdr)], config,
                                 upsert)[0]

    def _writer_write(self, key, tensor, wp, config, upsert, op):
        try:
            rank, size, split_dim = int(wp.rank), int(wp.size), int(wp.split_dim)
        except (AttributeError, TypeError, ValueError):
            log.error("%s: writer_partition must provide rank, size and split_dim", op)
            return INVALID
        torch = torch_module()
        t = check_tensor(torch, tensor, op, key)
        if t is None:
            return INVALID
        if size <= 0 or not 0 <= rank < size or not 0 <= split_dim < t.dim():
            log.error("%s: invalid writer partition rank %d size %d split_dim %d", op, rank, size,
                      split_dim)
            return INVALID
        extent = t.shape[split_dim]
        if extent % size:
            log.error("%s(%r): only uniform sharding is supported: dim %d of size %d into %d shards",
                      op, key, split_dim, extent, size)
            return INVALID
        chunk = extent // size
        shard = t.narrow(split_dim, rank * chunk, chunk)
        skey = writer_shard_key(key, rank, size, split_dim)
        axes = [(TP, rank, size, split_dim, 0, shard.shape[split_dim])]
        rc = self._write_parts([skey], [tensor_parts(shard, op, skey, t.shape, axes)], config, upsert)[0]
        if rc != 0:
            return rc
        manifest = pack_manifest(dtype_tables(torch)[0][t.dtype], t.shape, split_dim, size)
        from ._core import ReplicateConfig
        write = self.upsert if upsert else self.put
        return write(writer_manifest_key(key), manifest, ReplicateConfig() if config is None else config)

    def put_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None, writer_partition=None):
        """Put a tensor as a TensorParallelism shard set or a writer partition."""
        return self._parallel_write(key, tensor, parallelism, config, writer_partition, False,
                                    "put_tensor_with_parallelism")

    def upsert_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                       writer_partition=None):
        return self._parallel_write(key, tensor, parallelism, config, writer_partition, True,
                                    "upsert_tensor_with_parallelism")

    def _batch_parallel(self, keys, values, parallelisms, config, writer_partitions, upsert, op, one):
        keys, values = list(keys), list(values)
        n = len(keys)
        if parallelisms is not None and writer_partitions is not None:
            log.error("%s: writer_partitions cannot be combined with parallelisms", op)
            return [INVALID] * n
        if len(values) != n:
            log.error("%s: %d keys but %d values", op, n, len(values))
            return [INVALID] * n
        reqs = parallelisms if parallelisms is not None else writer_partitions
        if reqs is None:
            return None  # the caller's plain batch path
        if not isinstance(reqs, list) or len(reqs) != n:
            log.error("%s: parallelisms / writer_partitions must be a list of one per key", op)
            return [INVALID] * n
        if parallelisms is not None:
            return [one(k, v, p, None) for k, v, p in zip(keys, values, reqs)]
        return [one(k, v, None, w) for k, v, w in zip(keys, values, reqs)]

    def batch_put_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None, config=None,
                                          writer_partitions=None):
        r = self._batch_parallel(keys, tensors_list, parallelisms, config, writer_partitions, False,
                                 "batch_put_tensor_with_parallelism",
                                 lambda k, t, p, w: self.put_tensor_with_parallelism(k, t, p, config, w))
        return r if r is not None else self._batch_write(keys, tensors_list, config, False,
                                                          "batch_put_tensor_with_parallelism")

    def batch_upsert_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None, config=None,
                                             writer_partitions=None):
        r = self._batch_parallel(keys, tensors_list, parallelisms, config, writer_partitions, True,
                                 "batch_upsert_tensor_with_parallelism",
                                 lambda k, t, p, w: self.upsert_tensor_with_parallelism(k, t, p, config, w))
        return r if r is not None else self._batch_write(keys, tensors_list, config, True,
                                                          "batch_upsert_tensor_with_parallelism")

    def _parallel_write_from(self, key, ptr, size, parallelism, config, writer_partition, upsert, op):
        if parallelism is None and writer_partition is None:
            if _meta_at(ptr, size, op) is None or (config is not None and not _valid_config(config, op)):
                return INVALID
            from ._core import ReplicateConfig
            write = self.upsert_from if upsert else self.put_from
            return write(key, ptr, size, ReplicateConfig() if config is None else config)
        t = self._decode_at(ptr, size, op)
        if t is None:
            return INVALID
        return self._parallel_write(key, t, parallelism, config, writer_partition, upsert, op,
                                    from_buffer=True)

    def put_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None, config=None,
                                         writer_partition=None):
        return self._parallel_write_from(key, buffer_ptr, size, parallelism, config, writer_partition,
                                         False, "put_tensor_with_parallelism_from")

    def upsert_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None, config=None,
                                            writer_partition=None):
        return self._parallel_write_from(key, buffer_ptr, size, parallelism, config, writer_partition,
                                         True, "upsert_tensor_with_parallelism_from")

    def batch_put_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes, parallelisms=None,
                                               config=None, writer_partitions=None):
        return self._batch_parallel_from(keys, buffer_ptrs, sizes, parallelisms, config,
                                         writer_partitions, False, "batch_put_tensor_with_parallelism_from")

    def batch_upsert_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes, parallelisms=None,
                                                  config=None, writer_partitions=None):
        return self._batch_parallel_from(keys, buffer_ptrs, sizes, parallelisms, config,
                                         writer_partitions, True, "batch_upsert_tensor_with_parallelism_from")

    def _batch_parallel_from(self, keys, ptrs, sizes, parallelisms, config, writer_partitions, upsert, op):
        keys, ptrs, sizes = list(keys), list(ptrs), list(sizes)
        if len(sizes) != len(ptrs):
            log.error("%s: %d buffers but %d sizes", op, len(ptrs), len(sizes))
            return [INVALID] * len(keys)
        values = list(zip(ptrs, sizes))
        r = self._batch_parallel(keys, values, parallelisms, config, writer_partitions, upsert, op,
                                 lambda k, v, p, w: self._parallel_write_from(k, v[0], v[1], p, config, w,
                                                                              upsert, op))
        if r is not None:
            return r
        if config is not None and not _valid_config(config, op):
            return [INVALID] * len(keys)
        return self._from_buffers(keys, ptrs, sizes, upsert, op, True)

    def _resolve_read(self, key, target, op):
        """(mode, read_key or None, axes): where a ReadTarget reads from."""
        mode = getattr(target, "mode", "as_stored") if target is not None else "as_stored"
        mode = str(mode).lower()
        par = getattr(target, "parallelism", None) if target is not None else None
        if mode not in ("as_stored", "shard", "full"):
            log.error("%s: unsupported ReadTarget mode %r", op, mode)
            return None
        if mode == "as_stored":
            if par is not None:
                log.error("%s: ReadTarget(mode=as_stored) takes no parallelism", op)
                return None
            return ("as_stored", key, None)
        if mode == "full" and par is None:
            return ("writer_full", key, None)
        axes = parse_axes(par, op)
        if axes is None:
            return None
        if mode == "full":
            if not any(a[0] == TP for a in axes):
                log.error("%s: ReadTarget(mode=full): full reconstruction requires a TP axis", op)
                return None
            return ("full", key, axes)
        read_key = parallelism_key(key, axes)
        meta = self._meta_of(read_key)
        if meta is not None and meta.is_shard and canonical_axes(meta) == sorted(axes):
            return ("shard", read_key, axes)
        if len(axes) == 1 and axes[0][0] == TP:  # a writer partition with the same split
            _, rank, size, split_dim, _ = axes[0]
            wkey = writer_shard_key(key, rank, size, split_dim or 0)
            meta = self._meta_of(wkey)
            if meta is not None and meta.is_shard and canonical_axes(meta) == sorted(axes):
                return ("shard", wkey, axes)
        log.error("%s: parallelism metadata mismatch for key %r", op, key)
        return None

    def _full_tensor(self, key, how, axes, op):
        """A tensor rebuilt from its shards (torch.cat along the split dim), or None."""
        torch = torch_module()
        if torch is None:
            return None
        if how == "writer_full":
            raw = self.get(writer_manifest_key(key))
            if len(raw) != MANIFEST_SIZE:
                return self.get_tensor(key)
            manifest = parse_manifest(raw)
            if manifest is None:
                log.error("%s: invalid writer manifest for %r", op, key)
                return None
            _, shape, split_dim, count = manifest
            keys = [writer_shard_key(key, r, count, split_dim) for r in range(count)]
        else:
            tp = next(a for a in axes if a[0] == TP)
            count, split_dim = tp[2], tp[3]
            keys = [parallelism_key(key, with_tp_rank(axes, r)) for r in range(count)]
            shape = None
        shards = []
        for r, k in enumerate(keys):
            meta = self._meta_of(k)
            ax = meta.axis(TP) if meta is not None else None
            if meta is None or not meta.is_shard or ax is None or ax[1] != r or ax[2] != count \
                    or ax[3] != split_dim:
                log.error("%s: missing or mismatched shard %r of %r", op, k, key)
                return None
            shards.append(self.get_tensor(k))
        if any(s is None for s in shards):
            return None
        full = torch.cat(shards, dim=split_dim)
        if shape is None:
            shape = self._meta_of(keys[0]).global_shape
        if list(full.shape) != shape:
            log.error("%s: shards of %r make shape %s, the manifest says %s", op, key,
                      list(full.shape), shape)
            return None
        return full

    def get_tensor_with_parallelism(self, key, target=None):
        """Read as stored, one shard (mode "shard") or the whole tensor rebuilt
        from its TP shards or writer partitions (mode "full")."""
        r = self._resolve_read(key, target, "get_tensor_with_parallelism")
        if r is None:
            return None
        how, read_key, axes = r
        if how in ("as_stored", "shard"):
            return self.get_tensor(read_key)
        return self._full_tensor(key, how, axes, "get_tensor_with_parallelism")

    def batch_get_tensor_with_parallelism(self, keys, targets=None):
        keys = list(keys)
        if targets is None:
            return self.batch_get_tensor(keys)
        if not isinstance(targets, list) or len(targets) != len(keys):
            log.error("batch_get_tensor_with_parallelism: targets must be a list of one per key")
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism(k, t) for k, t in zip(keys, targets)]

    def get_tensor_with_parallelism_into(self, key, buffer_ptr, size, target=None):
        op = "get_tensor_with_parallelism_into"
        r = self._resolve_read(key, target, op)
        if r is None:
            return None
        how, read_key, axes = r
        if how in ("as_stored", "shard"):
            return self.get_tensor_into(read_key, buffer_ptr, size)
        full = self._full_tensor(key, how, axes, op)
        if full is None:
            return None
        parts = tensor_parts(full, op, key)
        ptr, size = _buffer_of(buffer_ptr, size)
        total = HEADER_SIZE + parts.nbytes
        if total > size:
            log.error("%s(%r): the rebuilt tensor needs %d bytes, the buffer has %d; nothing written",
                      op, key, total, size)
            return None
        ctypes.memmove(ptr, bytes(parts.meta), HEADER_SIZE)
        if parts.nbytes:
            ctypes.memmove(ptr + HEADER_SIZE, parts.data_ptr, parts.nbytes)
        return self._tensor_at(key, ptr, total, op)

    def batch_get_tensor_with_parallelism_into(self, keys, buffer_ptrs, sizes, targets=None):
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        if targets is None:
            return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)
        if not isinstance(targets, list) or not (len(targets) == len(keys) == len(buffer_ptrs) == len(sizes)):
            log.error("batch_get_tensor_with_parallelism_into: keys, buffer_ptrs, sizes and targets "
                      "must have the same length")
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism_into(k, p, n, t)
                for k, p, n, t in zip(keys, buffer_ptrs, sizes, targets)]

    # -- safetensors --

    def save_tensor_to_safetensor(self, key, file_name=None):
        """Write `key`'s tensor to a safetensors file (named `key` by default)."""
        t = self.get_tensor(key)
        if t is None:
            log.error("save_tensor_to_safetensor: no tensor under %r", key)
            return int(ErrorCode.FILE_NOT_FOUND)
        try:
            import safetensors.torch
            safetensors.torch.save_file({key: t.contiguous()}, key if file_name is None else file_name)
            return 0
        except Exception as e:  # ImportError included: the reference returns -600 too
            log.error("save_tensor_to_safetensor(%r): %s: %s", key, type(e).__name__, e)
            return INVALID

    def load_tensor_from_safetensor(self, key=None, file_name=None):
        """put_tensor of a tensor from a safetensors file; returns the tensor or None."""
        if file_name is None:
            raise TypeError("load_tensor_from_safetensor() missing required argument: 'file_name'")
        try:
            import safetensors.torch
            loaded = safetensors.torch.load_file(file_name)
        except Exception as e:
            log.error("load_tensor_from_safetensor(%r): %s: %s", file_name, type(e).__name__, e)
            return None
        if not loaded:
            log.error("load_tensor_from_safetensor: no tensors in %r", file_name)
            return None
        store_key = file_name if key is None else key
        name = store_key if (key is not None and store_key in loaded) else next(iter(loaded))
        if key is not None and name != store_key:
            log.warning("load_tensor_from_safetensor: %r not in %r; using its first tensor %r",
                        store_key, file_name, name)
        rc = self.put_tensor(store_key, loaded[name])
        if rc != 0:
            log.error("load_tensor_from_safetensor: put_tensor(%r) failed with %d", store_key, rc)
            return None
        return loaded[name]

    # -- CUDA --

    def get_tensor_into_cuda(self, key, tensor):
        log.warning("get_tensor_into_cuda: not supported (CPU-only build, no CUDA IPC client); "
                    "use get_tensor_into into a CPU tensor, then .to('cuda')")
        return NOT_SUPPORTED

    def batch_get_tensor_into_cuda(self, keys, tensors_list):
        log.warning("batch_get_tensor_into_cuda: not supported (CPU-only build, no CUDA IPC client); "
                    "use batch_get_tensor_into into CPU tensors, then .to('cuda')")
        return [NOT_SUPPORTED] * len(keys)
