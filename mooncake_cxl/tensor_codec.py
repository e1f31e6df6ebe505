"""Mooncake 0.3.13's tensor object format (mooncake-integration store_py),
byte for byte, so a tensor put by either client reads back in the other:

    [TensorMetadata: 304 bytes, little-endian][tensor bytes, C order]
    TensorObjectHeader (40 B): u32 magic 0x4d4f4f4e, u16 version 1,
        u16 header_size 304, i32 dtype (DTYPE_NAMES' index), i32 ndim (<= 8),
        u32 layout_kind (0 full, 1 shard), u32 reserved, u64 data_offset,
        u64 data_bytes
    TensorLayoutMetadata (264 B): i64 global_shape[8], i64 local_shape[8]
        (-1 past ndim), u32 axis_count (<= 4), u32 reserved, then 4 axes of
        {i32 kind (DP 0, TP 1, EP 2, PP 3), i32 axis_index, i32 shard_rank,
         i32 shard_count, i32 split_dim (-1: none), i32 expert/stage id,
         i64 local extent along split_dim}

and the writer-partition manifest (pack_manifest / parse_manifest).

Contract: pack_meta and tensor_parts encode; parse_meta and tensor_at decode
and validate a header before any tensor is built (the pool is memory every
client can write): a bad one gives None and the reason. Nothing here talks to
a store; the store's tensor methods (tensor.py) are built on this.

torch is an optional dependency (`pip install .[torch]`): torch_module()
gives None, logged once, without it.
"""
import ctypes
import logging
import struct
import warnings

from .extras import install_hint

log = logging.getLogger("mooncake_cxl")

MAGIC = 0x4D4F4F4E
VERSION = 1
MAX_DIMS = 8
MAX_AXES = 4
LAYOUT_FULL, LAYOUT_SHARD = 0, 1
_HEADER = struct.Struct("<IHHiiIIQQ")       # TensorObjectHeader, 40 bytes
_SHAPES = struct.Struct("<8q8qII")          # global, local shape, axis_count, reserved
_AXIS = struct.Struct("<iiiiiiq")           # LayoutAxis, 32 bytes
HEADER_SIZE = _HEADER.size + _SHAPES.size + MAX_AXES * _AXIS.size
assert HEADER_SIZE == 304
_FIXED = struct.Struct("<IHHiiIIQQ8q8qII")   # header + shapes, read in one go
_UNUSED = [(-1,) * (MAX_DIMS - n) for n in range(MAX_DIMS + 1)]

# Mooncake's TensorDtype numbers, by torch attribute name.
DTYPE_NAMES = ("float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
               "int64", "uint64", "bool", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")

AXIS_KINDS = ("dp", "tp", "ep", "pp")       # LayoutAxisKind 0..3, and the canonical order
DP, TP, EP, PP = range(4)

# The writer-partition manifest (key `K__writer_manifest`): u32 magic, u16
# version, u16 size, i32 dtype, ndim, split_dim, shard_count, reserved, pad,
# then the global shape (i64[8]): 96 bytes.
MANIFEST_MAGIC = 0x574D414E
_MANIFEST = struct.Struct("<IHHiiiii4x8q")
MANIFEST_SIZE = _MANIFEST.size
assert MANIFEST_SIZE == 96

_torch = None
_torch_missing_logged = False


def torch_module():
    """torch, or None (logged once) when it is not installed."""
    global _torch, _torch_missing_logged
    if _torch is None:
        try:
            import torch
            _torch = torch
        except ImportError:
            if not _torch_missing_logged:
                log.error("tensor methods need torch (the 'torch' extra): %s", install_hint("torch"))
                _torch_missing_logged = True
            return None
    return _torch


_tables = None


def dtype_tables(torch):
    """({torch dtype: Mooncake code}, {code: torch dtype}), built once."""
    global _tables
    if _tables is None:
        to_code, from_code = {}, {}
        for code, name in enumerate(DTYPE_NAMES):
            dt = getattr(torch, name, None)
            if dt is not None:
                to_code[dt] = code
                from_code[code] = dt
        _tables = (to_code, from_code)
    return _tables


# ---------------------------------------------------------------- the header

class TensorMeta:
    """A parsed, validated TensorMetadata."""
    __slots__ = ("dtype", "ndim", "layout_kind", "data_offset", "data_bytes", "global_shape",
                 "local_shape", "axes")

    def axis(self, kind):
        for a in self.axes:
            if a[0] == kind:
                return a
        return None

    @property
    def is_shard(self):
        return self.layout_kind == LAYOUT_SHARD

    @property
    def total(self):
        return self.data_offset + self.data_bytes


def pack_meta(dtype, global_shape, local_shape=None, data_bytes=0, layout_kind=LAYOUT_FULL, axes=()):
    """TensorMetadata bytes. `axes`: (kind, rank, count, split_dim|-1, id, extent) tuples."""
    local_shape = global_shape if local_shape is None else local_shape
    ndim = len(global_shape)
    pad = lambda s: list(s) + [-1] * (MAX_DIMS - len(s))  # noqa: E731
    out = bytearray(HEADER_SIZE)
    _HEADER.pack_into(out, 0, MAGIC, VERSION, HEADER_SIZE, dtype, ndim, layout_kind, 0,
                      HEADER_SIZE, data_bytes)
    _SHAPES.pack_into(out, _HEADER.size, *pad(global_shape), *pad(local_shape), len(axes), 0)
    for i, (kind, rank, count, split_dim, ident, extent) in enumerate(axes):
        _AXIS.pack_into(out, _HEADER.size + _SHAPES.size + i * _AXIS.size, kind, i, rank, count,
                        split_dim, ident, extent)
    return out


def _itemsize(code):
    return 2 if code in (4, 5, 11, 12) else 4 if code in (0, 6, 7) else 8 if code in (1, 8, 9) else 1


# Valid headers already parsed, by (header bytes, object length): KV blocks
# repeat a handful of shapes, and parsing is most of a small get_tensor's
# Python time. The result depends only on the key, so a hit is the same
# answer; TensorMeta objects are never modified after parse_meta.
_META_CACHE = {}
_META_CACHE_MAX = 1024


def parse_meta(head, total_length):
    """TensorMeta from the first bytes of an object of `total_length` bytes,
    or (None, why). Checks what Mooncake's ValidateTensorMetadata checks, and
    that data_bytes is exactly the local shape's bytes (so no tensor is ever
    built over bytes it does not own)."""
    if total_length < HEADER_SIZE or len(head) < HEADER_SIZE:
        return None, f"{total_length} bytes is shorter than the {HEADER_SIZE}-byte tensor header"
    ck = (head if type(head) is bytes and len(head) == HEADER_SIZE else bytes(head[:HEADER_SIZE]), total_length)
    hit = _META_CACHE.get(ck)
    if hit is not None:
        return hit, ""
    m, why = _parse_meta(ck[0], total_length)
    if m is not None:
        if len(_META_CACHE) >= _META_CACHE_MAX:
            _META_CACHE.clear()
        _META_CACHE[ck] = m
    return m, why


def _parse_meta(head, total_length):
    f = _FIXED.unpack_from(head, 0)
    magic, version, hsize, dtype, ndim, kind, _, off, nbytes = f[:9]
    if magic != MAGIC or version != VERSION or hsize != HEADER_SIZE:
        return None, "not a tensor object (magic, version or header size)"
    if not 0 <= dtype < len(DTYPE_NAMES):
        return None, f"unknown dtype code {dtype}"
    if not 0 <= ndim <= MAX_DIMS or kind > LAYOUT_SHARD:
        return None, f"bad ndim {ndim} or layout kind {kind}"
    if not HEADER_SIZE <= off <= total_length or nbytes != total_length - off:
        return None, f"data offset {off} / size {nbytes} do not match the object's {total_length} bytes"
    gshape, lshape, naxes = f[9:9 + ndim], f[17:17 + ndim], f[25]
    if naxes > MAX_AXES or min(gshape + lshape, default=0) < 0 or \
            f[9 + ndim:17] != _UNUSED[ndim] or f[17 + ndim:25] != _UNUSED[ndim]:
        return None, "bad shape or axis count"
    axes = []
    for i in range(naxes):
        a = _AXIS.unpack_from(head, _HEADER.size + _SHAPES.size + i * _AXIS.size)
        k, _, rank, count, split_dim, ident, extent = a
        if not 0 <= k <= 4 or count <= 0 or not 0 <= rank < count or not -1 <= split_dim < ndim:
            return None, f"bad layout axis {i}"
        axes.append((k, rank, count, split_dim, ident, extent))
    m = TensorMeta()
    m.dtype, m.ndim, m.layout_kind, m.data_offset, m.data_bytes = dtype, ndim, kind, off, nbytes
    m.global_shape, m.local_shape, m.axes = list(gshape), list(lshape), axes
    numel = 1
    for d in m.local_shape:
        numel *= d
    if numel * _itemsize(dtype) != nbytes:
        return None, f"{nbytes} data bytes for shape {m.local_shape} of dtype {DTYPE_NAMES[dtype]}"
    return m, ""


def canonical_axes(meta):
    """The parallelism a shard's header records, canonical: [(kind, rank, size, split_dim|None, id|None)]."""
    out = []
    for kind, rank, count, split_dim, ident, _ in meta.axes:
        out.append((kind, rank, count, split_dim if split_dim >= 0 else None,
                    ident if kind in (EP, PP) else None))
    return sorted(out)


# ---------------------------------------------------------------- tensors <-> bytes

class TensorParts:
    """A tensor ready to be stored: its header and its bytes, kept alive."""
    __slots__ = ("meta", "data_ptr", "nbytes", "_keep")

    def __init__(self, meta, data_ptr, nbytes, keep):
        self.meta, self.data_ptr, self.nbytes, self._keep = meta, data_ptr, nbytes, keep

    def buffers(self):
        """(pointers, sizes) for the multi-buffer put paths."""
        ptrs, sizes = [ctypes.addressof(ctypes.c_char.from_buffer(self.meta))], [HEADER_SIZE]
        if self.nbytes:
            ptrs.append(self.data_ptr)
            sizes.append(self.nbytes)
        return ptrs, sizes


def check_tensor(torch, tensor, op, key):
    """`tensor` when this format can store it (a CPU torch tensor of at most
    MAX_DIMS dimensions and one of Mooncake's dtypes), else None (logged)."""
    if torch is None:
        return None
    if not isinstance(tensor, torch.Tensor):
        log.error("%s(%r): not a torch tensor but %s", op, key, type(tensor).__name__)
        return None
    if tensor.device.type != "cpu":
        log.error("%s(%r): tensor is on %s; this build stores CPU tensors (use .cpu())", op, key,
                  tensor.device)
        return None
    if tensor.dim() > MAX_DIMS:
        log.error("%s(%r): tensor has %d dimensions, at most %d are supported", op, key,
                  tensor.dim(), MAX_DIMS)
        return None
    if tensor.dtype not in dtype_tables(torch)[0]:
        log.error("%s(%r): unsupported tensor dtype %s", op, key, tensor.dtype)
        return None
    return tensor


def tensor_parts(tensor, op="put_tensor", key="", full_shape=None, axes=()):
    """TensorParts of a CPU tensor (a shard when `axes` is given), or None (logged)."""
    torch = torch_module()
    t = check_tensor(torch, tensor, op, key)
    if t is None:
        return None
    c = t.detach().contiguous()  # no copy when it already is
    nbytes = c.numel() * c.element_size()
    code = dtype_tables(torch)[0][t.dtype]
    shape = list(t.shape)
    if axes:
        meta = pack_meta(code, list(full_shape), shape, nbytes, LAYOUT_SHARD, axes)
    else:
        meta = pack_meta(code, shape, shape, nbytes)
    return TensorParts(meta, c.data_ptr(), nbytes, c)


def tensor_at(ptr, length, op, key, copy=True, owner=None):
    """The tensor stored in the `length` bytes at `ptr`, or None (logged).
    copy=True: a new tensor of its own (one copy). copy=False: a tensor viewing
    that memory, kept alive through `owner` (a buffer object over it: a
    BufferHandle, or caller memory)."""
    torch = torch_module()
    if torch is None:
        return None
    if length < HEADER_SIZE:
        log.error("%s(%r): %d bytes cannot hold a tensor object", op, key, length)
        return None
    meta, why = parse_meta(ctypes.string_at(ptr, HEADER_SIZE), length)
    if meta is None:
        log.error("%s(%r): invalid tensor object: %s", op, key, why)
        return None
    dtype = dtype_tables(torch)[1].get(meta.dtype)
    if dtype is None:
        log.error("%s(%r): dtype %s is not in this torch", op, key, DTYPE_NAMES[meta.dtype])
        return None
    if copy or not meta.data_bytes:
        out = torch.empty(meta.local_shape, dtype=dtype)
        if meta.data_bytes:
            ctypes.memmove(out.data_ptr(), ptr + meta.data_offset, meta.data_bytes)
        return out
    numel = meta.data_bytes // _itemsize(meta.dtype)
    if isinstance(owner, ctypes.Array):  # caller memory: writable
        flat = torch.frombuffer(owner, dtype=dtype, count=numel, offset=meta.data_offset)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a read-only BufferHandle: torch warns; documented
            flat = torch.frombuffer(owner, dtype=dtype, count=numel, offset=meta.data_offset)
    return flat.reshape(meta.local_shape)


# ---------------------------------------------------------------- the writer-partition manifest

def pack_manifest(dtype, shape, split_dim, count):
    """The manifest of a tensor of `shape` (Mooncake dtype code `dtype`) written
    as `count` partitions along split_dim."""
    shape = list(shape)
    return _MANIFEST.pack(MANIFEST_MAGIC, 1, MANIFEST_SIZE, dtype, len(shape), split_dim, count, 0,
                          *shape, *[-1] * (MAX_DIMS - len(shape)))


def parse_manifest(raw):
    """(dtype, shape, split_dim, count) of MANIFEST_SIZE bytes, or None when they
    are not a valid manifest (at most 65536 partitions)."""
    if len(raw) != MANIFEST_SIZE:
        return None
    f = _MANIFEST.unpack(raw)
    magic, version, hsize, dtype, ndim, split_dim, count = f[:7]
    if magic != MANIFEST_MAGIC or version != 1 or hsize != MANIFEST_SIZE or \
            not 0 <= split_dim < ndim <= MAX_DIMS or count <= 0 or count > 1 << 16:
        return None
    return dtype, list(f[8:8 + ndim]), split_dim, count
