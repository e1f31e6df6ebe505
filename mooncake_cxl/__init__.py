"""mooncake_cxl: a KV-cache store in a CXL memory pool, a drop-in for
Mooncake's ``mooncake.store.MooncakeDistributedStore``.

    from mooncake_cxl import MooncakeDistributedStore, ReplicateConfig
"""
from ._core import BufferHandle, ObjectDataType, ReplicaStatus, ReplicateConfig, SoftPinAction
from .errors import ErrorCode
from .host_mem import MooncakeHostMemAllocator, bind_to_numa_node
from .replica import Descriptor, DiskDescriptor, MemoryDescriptor, ReplicaDescriptor
from .store import MooncakeDistributedStore
from .tensor import ParallelAxis, ReadTarget, TensorParallelism

__all__ = [
    "MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ReplicaStatus",
    "ObjectDataType", "ErrorCode", "BufferHandle", "ReplicaDescriptor", "MemoryDescriptor",
    "DiskDescriptor", "Descriptor", "ParallelAxis", "TensorParallelism", "ReadTarget",
    "MooncakeHostMemAllocator", "bind_to_numa_node",
]
