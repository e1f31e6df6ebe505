"""Host memory for zero-copy buffers: Mooncake's MooncakeHostMemAllocator and
bind_to_numa_node, as SGLang's standalone_storage mode and LMCache use them.

Contract:
  * MooncakeHostMemAllocator().alloc(size) returns the address of `size`
    zero-filled bytes of anonymous shared memory (0 for size 0 or when the
    mapping fails, with one log line); free(address) unmaps it and returns 0,
    or INVALID_PARAMS (-600) for an address this allocator did not hand out.
    The reference places these bytes in shared memory so its standalone client
    can read them; here a dummy client maps the pool itself, so plain memory
    registered with register_buffer() is all a zero-copy call needs.
  * bind_to_numa_node(node) pins the calling process's CPU affinity to that
    node's CPUs (from sysfs); memory placement follows first touch. An unknown
    node is logged and changes nothing.
"""
import ctypes
import logging
import mmap
import os
import threading

from .errors import ErrorCode

log = logging.getLogger("mooncake_cxl")


class MooncakeHostMemAllocator:
    def __init__(self):
        self._lock = threading.Lock()
        self._maps = {}  # address -> mmap

    def alloc(self, size, /):
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise TypeError(f"alloc(): size must be a non-negative int, not {size!r}")
        if size == 0:
            log.error("MooncakeHostMemAllocator.alloc(0): size is 0")
            return 0
        try:
            m = mmap.mmap(-1, size)
        except (OSError, OverflowError, ValueError) as e:
            log.error("MooncakeHostMemAllocator.alloc(%d): cannot map that much memory: %s", size, e)
            return 0
        buf = ctypes.c_char.from_buffer(m)
        addr = ctypes.addressof(buf)
        del buf  # the export would forbid m.close() in free()
        with self._lock:
            self._maps[addr] = m
        return addr

    def free(self, ptr, /):
        with self._lock:
            m = self._maps.pop(ptr, None)
        if m is None:
            log.error("MooncakeHostMemAllocator.free(%#x): not an address this allocator handed out",
                      ptr if isinstance(ptr, int) else 0)
            return int(ErrorCode.INVALID_PARAMS)
        try:
            m.close()
        except BufferError:
            # Something (a tensor over it) still holds the memory: keep it mapped.
            with self._lock:
                self._maps[ptr] = m
            log.warning("MooncakeHostMemAllocator.free(%#x): still in use; not unmapped", ptr)
            return int(ErrorCode.INVALID_PARAMS)
        return 0


def _parse_cpulist(text):
    cpus = set()
    for part in text.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.update(range(int(lo), int(hi) + 1))
        elif part:
            cpus.add(int(part))
    return cpus


def bind_to_numa_node(node):
    """Run the calling process on NUMA node `node`'s CPUs."""
    if not isinstance(node, int) or isinstance(node, bool) or node < 0:
        raise TypeError(f"bind_to_numa_node(): node must be a non-negative int, not {node!r}")
    try:
        with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
            cpus = _parse_cpulist(f.read()) & os.sched_getaffinity(0)
    except (OSError, ValueError) as e:
        log.warning("bind_to_numa_node(%d): no such NUMA node here (%s); not bound", node, e)
        return
    if cpus:
        os.sched_setaffinity(0, cpus)
