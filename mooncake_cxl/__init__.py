"""mooncake_cxl: a KV-cache store in a CXL memory pool, a drop-in for
Mooncake's ``mooncake.store.MooncakeDistributedStore``.

    from mooncake_cxl import MooncakeDistributedStore, ReplicateConfig
"""
from ._core import BufferHandle, ObjectDataType, ReplicaStatus, ReplicateConfig, SoftPinAction
from .errors import ErrorCode
from .store import MooncakeDistributedStore

__all__ = [
    "MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ReplicaStatus",
    "ObjectDataType", "ErrorCode", "BufferHandle",
]
