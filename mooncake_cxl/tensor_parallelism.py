"""Mooncake's tensor parallelism: the specs a caller passes (ParallelAxis,
TensorParallelism, ReadTarget, read by attribute so the reference's own
objects work too), their validation, and the keys Mooncake 0.3.13 stores
each shard under:

    K_tp_R                            a single TP axis, rank R
    K__tp_0of2_sd1__ep_1of4_eid7...   any other set of axes, in canonical order
    K__writer_RofN_sdD                writer partition R of N along dim D
    K__writer_manifest                the manifest of a partitioned write

An axis here is (kind, rank, size, split_dim|None, id|None), kind from
tensor_codec (DP, TP, EP, PP).
"""
import logging

from .tensor_codec import AXIS_KINDS, EP, MAX_AXES, PP, TP

log = logging.getLogger("mooncake_cxl")


# ---------------------------------------------------------------- the specs

class ParallelAxis:
    """One axis of a TensorParallelism (Mooncake's ParallelAxis): kind is
    "tp", "dp", "ep" or "pp"; TP needs split_dim, EP expert_id, PP stage_id."""

    def __init__(self, kind="", rank=0, size=1, split_dim=None, expert_id=None, stage_id=None):
        self.kind, self.rank, self.size = kind, rank, size
        self.split_dim, self.expert_id, self.stage_id = split_dim, expert_id, stage_id

    def __repr__(self):
        return (f"ParallelAxis(kind={self.kind!r}, rank={self.rank}, size={self.size}, "
                f"split_dim={self.split_dim}, expert_id={self.expert_id}, stage_id={self.stage_id})")


class TensorParallelism:
    """Mooncake's TensorParallelism: a list of ParallelAxis."""

    def __init__(self, axes=None):
        self.axes = list(axes or [])

    def __repr__(self):
        return f"TensorParallelism(axes={self.axes!r})"


class ReadTarget:
    """Mooncake's ReadTarget: mode "as_stored" (default), "shard" or "full",
    and an optional TensorParallelism."""

    def __init__(self, mode="as_stored", parallelism=None):
        self.mode = mode
        self.parallelism = parallelism

    @property
    def mode(self):
        return self._mode

    @mode.setter
    def mode(self, value):
        v = str(value).lower()
        if v not in ("as_stored", "shard", "full"):
            raise RuntimeError("Unsupported ReadTarget mode")
        self._mode = v

    def __repr__(self):
        return f"ReadTarget(mode={self.mode!r}, parallelism={self.parallelism!r})"


def parse_axes(parallelism, op):
    """Validated axes [(kind, rank, size, split_dim, id)] of a TensorParallelism
    (ours or the reference's: read by attribute), in the caller's order (the
    order of a shard header's axes, as Mooncake writes them), or None (logged)."""
    try:
        raw = list(parallelism.axes)
    except (AttributeError, TypeError):
        log.error("%s: parallelism must be a TensorParallelism with .axes", op)
        return None
    if not raw or len(raw) > MAX_AXES:
        log.error("%s: parallelism needs 1 to %d axes, has %d", op, MAX_AXES, len(raw))
        return None
    axes, seen = [], set()
    for a in raw:
        try:
            kind = AXIS_KINDS.index(str(a.kind).lower())
            rank, size = int(a.rank), int(a.size)
            split_dim, eid, sid = a.split_dim, a.expert_id, a.stage_id
        except (AttributeError, ValueError, TypeError):
            log.error("%s: bad ParallelAxis %r (kind must be tp, dp, ep or pp)", op, a)
            return None
        why = None
        if size <= 0 or not 0 <= rank < size:
            why = f"rank {rank} / size {size}"
        elif kind in seen:
            why = "duplicate axis kinds"
        elif kind == TP and split_dim is None:
            why = "a TP axis needs split_dim"
        elif kind != TP and split_dim is not None:
            why = f"a {AXIS_KINDS[kind].upper()} axis takes no split_dim"
        elif kind == EP and eid is None:
            why = "an EP axis needs expert_id"
        elif kind == PP and sid is None:
            why = "a PP axis needs stage_id"
        if why:
            log.error("%s: invalid parallelism: %s", op, why)
            return None
        seen.add(kind)
        axes.append((kind, rank, size, None if split_dim is None else int(split_dim),
                     int(eid) if kind == EP else int(sid) if kind == PP else None))
    return axes


# ---------------------------------------------------------------- the keys

def parallelism_key(base, axes):
    """Mooncake's key of one shard: K_tp_R for a single TP axis, else
    K__tp_0of2_sd1__ep_... in canonical axis order."""
    if len(axes) == 1 and axes[0][0] == TP:
        return f"{base}_tp_{axes[0][1]}"
    key = base
    for kind, rank, size, split_dim, ident in sorted(axes):
        key += f"__{AXIS_KINDS[kind]}_{rank}of{size}"
        if split_dim is not None:
            key += f"_sd{split_dim}"
        if kind == EP:
            key += f"_eid{ident}"
        if kind == PP:
            key += f"_sid{ident}"
    return key


def writer_shard_key(base, rank, size, split_dim):
    return f"{base}__writer_{rank}of{size}_sd{split_dim}"


def writer_manifest_key(base):
    return f"{base}__writer_manifest"


def with_tp_rank(axes, rank):
    """`axes` with the TP axis's rank replaced by `rank`."""
    return [(k, rank if k == TP else r, s, d, i) for k, r, s, d, i in axes]
