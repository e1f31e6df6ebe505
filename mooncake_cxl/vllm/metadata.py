"""What the scheduler half tells the worker half each step (picklable)."""
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass
class LoadSpec:
    """Copy request blocks [start, end) of `objects` (a kv Prefix's objects)
    into engine blocks block_ids[start:end]."""
    start: int
    end: int
    objects: list


@dataclass
class SaveSpec:
    """Store request blocks [start, end) (hashes[:end] live in block_ids[:end]).
    key: the announcement key (producer), first: the request's first save
    step, done: the prompt is complete after this step."""
    start: int
    end: int
    hashes: list
    key: int | None = None
    first: bool = False
    done: bool = False


@dataclass
class AsyncLoadSpec:
    """Load request blocks [start, end) into block_ids as the producer
    announces them (key), for at most budget_s seconds. hashes: every full
    prompt block (may be one more than end: see Prefix.upto)."""
    req_id: str
    block_ids: list
    start: int
    end: int
    hashes: list
    key: int
    budget_s: float


@dataclass
class ReqSpec:
    req_id: str
    block_ids: list
    load: LoadSpec | None = None
    save: SaveSpec | None = None


@dataclass
class MCXLMetadata(KVConnectorMetadata):
    requests: list = field(default_factory=list)
    aborted_keys: list = field(default_factory=list)  # producer: announce these as aborted
    async_loads: list = field(default_factory=list)   # consumer: AsyncLoadSpecs to start
