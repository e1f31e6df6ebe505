"""The pool's pages: how much of the pool file is allocated and of one
process's mapping resident (the background population's progress), and the
page size its copies run on (4 KiB, or 2 MiB when the mapping is mostly
huge-page mapped: tmpfs huge=advise, hugetlbfs, device-DAX)."""
import os
import time

from .common import KIB, MIB


def _mapping_fields(pid, path):
    """Numeric smaps fields (kB) of the mappings of `path` in `pid`: summed,
    but the page sizes (the largest)."""
    real = os.path.realpath(path)
    fields, inside = {}, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                inside = len(head) >= 6 and head[5] == real
            elif inside and len(head) >= 2 and head[0].endswith(":") and head[1].isdigit():
                name, kb = head[0][:-1], int(head[1])
                per_mapping = name in ("KernelPageSize", "MMUPageSize")
                fields[name] = max(fields.get(name, 0), kb) if per_mapping else fields.get(name, 0) + kb
    return fields


def resident_bytes(pid, path):
    return _mapping_fields(pid, path).get("Rss", 0) * KIB


def wait_allocated(path, size, timeout=120.0):
    """Waits until the pool file has all its blocks (the master allocates
    them in the background); the seconds waited, or None past `timeout`."""
    t0 = time.monotonic()
    while os.stat(path).st_blocks * 512 < size:
        if time.monotonic() - t0 > timeout:
            return None
        time.sleep(0.02)  # polling a background thread's progress
    return time.monotonic() - t0


def wait_resident(pid, path, size, timeout=120.0):
    """Waits until `pid` has the whole pool mapped (the prefault default
    populates it in the background); returns the seconds waited, or None if
    it was not done by `timeout` (the rows then say so)."""
    t0 = time.monotonic()
    while resident_bytes(pid, path) < size:
        if time.monotonic() - t0 > timeout:
            return None
        time.sleep(0.02)  # polling a background thread's progress
    return time.monotonic() - t0


def page_size(pid, path):
    """'2 MiB' when most of the resident mapping is huge-page mapped, else
    the kernel page size of the mapping ('4 KiB')."""
    f = _mapping_fields(pid, path)
    huge = f.get("FilePmdMapped", 0) + f.get("ShmemPmdMapped", 0) + f.get("Private_Hugetlb", 0) + \
        f.get("Shared_Hugetlb", 0)
    if f.get("Rss", 0) and huge * 2 >= f.get("Rss", 0) + f.get("Shared_Hugetlb", 0) + f.get("Private_Hugetlb", 0):
        return "2 MiB"
    mmu = f.get("MMUPageSize", 4) * KIB
    return "2 MiB" if mmu >= 2 * MIB else f"{mmu // KIB} KiB"
