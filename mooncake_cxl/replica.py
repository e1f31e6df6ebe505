"""Replica descriptors (get_replica_desc, batch_get_replica_desc) and
batch_replica_clear, with the shapes of Mooncake 0.3.13.

A CXL pool holds one copy of each object, in memory every host maps, so a
key has exactly one replica: a COMPLETE memory replica. Its descriptor says
where it is: `segment_name` (the local_hostname of the client that wrote it,
as the reference names a segment by its owner; "" when that client's slot no
longer says), `offset` (the object's offset in the pool, as /query_key shows
it) and `size` (the value's bytes). The reference's view of the same facts is
kept too: get_memory_descriptor().buffer_descriptor has size,
buffer_address (= offset) and transport_endpoint (= segment_name).

Descriptors are read from the pool's index: no master round trip, no lease.
`read_by` says how this client's reads reach the bytes: "pool" (it maps the
pool: loads from the mapping) or "transfer_engine" (a host outside the pod:
Transfer Engine reads from the process serving the pool, `te_session`) or
"segment" (the value is in its writer's DRAM segment, `segment_name`: its own
reads, or another client's where the owner serves no engine: a miss). Another
in-pod client reads a served segment over TE: "transfer_engine", the owner's
`te_session`.
"""
import logging

from .errors import ErrorCode

log = logging.getLogger("mooncake_cxl")


class Descriptor:
    """Mooncake's AllocatedBuffer::Descriptor (where a memory replica's bytes are)."""

    def __init__(self, size=0, buffer_address=0, transport_endpoint=""):
        self.size, self.buffer_address, self.transport_endpoint = size, buffer_address, transport_endpoint

    def __repr__(self):
        return (f"<Descriptor size={self.size} buffer_address={self.buffer_address} "
                f"transport_endpoint={self.transport_endpoint}>")


class MemoryDescriptor:
    def __init__(self, buffer_descriptor=None):
        self.buffer_descriptor = buffer_descriptor or Descriptor()


class DiskDescriptor:
    def __init__(self, file_path="", object_size=0):
        self.file_path, self.object_size = file_path, object_size


class ReplicaDescriptor:
    """One replica of an object: a COMPLETE memory replica in the pool, or,
    for an object whose value is in the SSD tier, a COMPLETE LOCAL_DISK replica
    (its file is the tier's directory, shared by every host of the pod)."""

    def __init__(self, segment_name, offset, size, tier="memory", disk_root="", te_session=None,
                 read_by=None):
        from ._core import ReplicaStatus
        self.status = ReplicaStatus.COMPLETE
        self.segment_name = segment_name  # ours
        self.offset = offset              # ours: the object's (or its stub's) offset in the pool
        self.size = size                  # ours: the value's bytes
        self.tier = tier                  # ours: "memory" or "disk"
        # ours: this client's reads ("segment": in segment_name's DRAM segment)
        self.read_by = read_by or ("pool" if te_session is None else "transfer_engine")
        self.te_session = te_session or ""  # ours: the engine serving them, when read_by says so
        self._memory = MemoryDescriptor(Descriptor(size, offset, segment_name))
        self._disk = DiskDescriptor(disk_root, size)

    def is_memory_replica(self):
        return self.tier == "memory"

    def is_disk_replica(self):
        return self.tier == "disk"

    def is_local_disk_replica(self):
        return self.tier == "disk"

    def get_memory_descriptor(self):
        if self.tier != "memory":
            raise RuntimeError("Expected MemoryDescriptor")
        return self._memory

    def get_disk_descriptor(self):
        if self.tier != "disk":
            raise RuntimeError("Expected DiskDescriptor")
        return self._disk

    def __repr__(self):
        return (f"ReplicaDescriptor(status={self.status.name}, {self.tier}, segment_name={self.segment_name!r}, "
                f"offset={self.offset}, size={self.size}, read_by={self.read_by})")


class ReplicaMethods:
    """Mixed into MooncakeDistributedStore (which supplies _replica_info and batch_remove)."""

    def _replica(self, key):
        info = self._replica_info(key)
        if isinstance(info, int):
            return None
        return ReplicaDescriptor(info.get("segment_name") or info["writer"], info["offset"], info["size"], info.get("tier", "memory"),
                                 info.get("disk_root", ""), info.get("te_session"),
                                 info.get("read_by"))

    def get_replica_desc(self, key):
        """[ReplicaDescriptor] of `key`: one memory replica, or [] when missing.
        Grants the object a lease, as Mooncake's replica query does."""
        d = self._replica(key)
        if d is None:
            return []
        self.is_exist(key)  # the lease (a write to the entry's lease word, no master round trip)
        return [d]

    def batch_get_replica_desc(self, keys):
        """{key: [ReplicaDescriptor]} for the keys that exist (missing keys are
        left out, as in Mooncake). Grants each found object a lease."""
        out = {}
        for key in keys:
            d = self.get_replica_desc(key)
            if d:
                out[key] = d
        return out

    def batch_replica_clear(self, keys, segment_name=""):
        """Remove the replicas of `keys` that this client wrote (on `segment_name`
        only, when given) and whose lease has expired; returns the keys cleared.
        Missing, leased and other clients' keys are skipped, as in Mooncake's
        master. One master round trip. With one replica per key, clearing it
        removes the key. "This client wrote it" is judged by local_hostname."""
        if self.health_check() == 1:
            log.error("batch_replica_clear() called before setup() or after close()")
            return []
        me = self.get_hostname()
        candidates = []
        for key in dict.fromkeys(keys):
            d = self._replica(key)
            if d is not None and d.segment_name == me and (not segment_name or segment_name == me):
                candidates.append(key)
        if not candidates:
            return []
        rs = self.batch_remove(candidates, force=False)
        return [k for k, r in zip(candidates, rs) if r == 0]


__all__ = ["Descriptor", "MemoryDescriptor", "DiskDescriptor", "ReplicaDescriptor", "ReplicaMethods",
           "ErrorCode"]
