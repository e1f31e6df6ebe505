"""Child-process bodies for tests/faults/test_view_stability.py (spawned, so they live
in an importable module)."""
import hashlib
import os


def connect(address):
    from mooncake_cxl import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address)
    if rc != 0:
        raise RuntimeError(f"setup in pid {os.getpid()} returned {rc}")
    return s


def digest(b):
    return hashlib.sha256(bytes(b)).hexdigest()


def look(h):
    """What the holder sees through its handle: ("bytes", digest), or
    ("refused", message) when the handle raises (allowed, never other bytes)."""
    try:
        mv = memoryview(h)
        return ("bytes", digest(mv))
    except BufferError as e:
        return ("refused", str(e))


def holder(address, key, q, steps, close_first):
    """Takes a handle on `key`, reports what it sees, then for each event in
    `steps` waits for it and reports again. With close_first, the store is
    closed right after the handle is taken. Drops the handle at the end and
    reports that the store still works (unless closed)."""
    s = connect(address)
    h = s.get_buffer(key)
    if h is None:
        q.put(("error", "get_buffer returned None"))
        return
    q.put(look(h))
    if close_first:
        s.close()
        q.put(look(h))
    for ev in steps:
        if not ev.wait(120):
            q.put(("error", "timed out waiting for the driver"))
            return
        q.put(look(h))
    del h
    if not close_first:
        # The store is usable after whatever happened (re-attached).
        rc = s.put(f"{key}/holder-after", b"x" * 4096)
        if rc == -901:
            # A put racing the heartbeat thread's re-attach after a resume can
            # time out on the reset ring: once more.
            rc = s.put(f"{key}/holder-after", b"x" * 4096)
        h2 = s.get_buffer(f"{key}/holder-after")  # a new view in the table it holds now
        ok = s.get(f"{key}/holder-after") == b"x" * 4096 and h2 is not None and bytes(h2) == b"x" * 4096
        del h2
        q.put(("after", rc, ok))
        s.close()
    else:
        q.put(("after", 0, True))
