"""Child-process bodies for tests/faults/test_stall.py (spawned: importable).

A stalled writer (a put whose copy blocks on a userfaultfd page, then the
process is SIGSTOPped), a filler of hard-pinned checksummed objects, and the
two clients of the ring-sharing test: A, which keeps putting while the test
stops and resumes it, and B, which attaches to the slot A lost."""
import os
import random
import threading
import traceback
import zlib

from conftest import poll

MiB = 1 << 20
NO_AVAILABLE_HANDLE = -200

SYS_userfaultfd = 323  # x86_64
UFFD_USER_MODE_ONLY = 1
UFFDIO_API = 0xc018aa3f
UFFDIO_REGISTER = 0xc020aa00
UFFDIO_REGISTER_MODE_MISSING = 1


def connect(address):
    from mooncake_cxl import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address)
    assert rc == 0, f"setup returned {rc}"
    return s


def value_for(key, size):
    """Bytes derived from the key; the last 4 bytes are a CRC of the rest."""
    body = random.Random(key).randbytes(size - 4)
    return body + zlib.crc32(body).to_bytes(4, "little")


def stalling_buffer(size, stall_at):
    """(mmap, userfaultfd): reading at or past `stall_at` (page-aligned)
    blocks until the userfaultfd is closed (then those pages read as zeros).
    Raises OSError when userfaultfd is unavailable."""
    import ctypes
    import fcntl
    import mmap
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if os.uname().machine != "x86_64":
        raise OSError("userfaultfd syscall number known for x86_64 only")
    fd = libc.syscall(SYS_userfaultfd, os.O_CLOEXEC | os.O_NONBLOCK | UFFD_USER_MODE_ONLY)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "userfaultfd")
    fcntl.ioctl(fd, UFFDIO_API, bytearray(struct.pack("QQQ", 0xAA, 0, 0)))
    mm = mmap.mmap(-1, size)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    mm[:stall_at] = b"\xa5" * stall_at  # populated: copies fine
    fcntl.ioctl(fd, UFFDIO_REGISTER, bytearray(struct.pack(
        "QQQQ", addr + stall_at, size - stall_at, UFFDIO_REGISTER_MODE_MISSING, 0)))
    return mm, fd


def stalled_writer(conn, address, key, size, stall_at):
    """Puts `key` from a stalling buffer. -> ("blocked",) once the copy is
    stuck on the userfaultfd page; <- "release" lets it go (the rest of the
    value reads as zeros); -> ("done", rc of the stalled put, rc of a put
    after it)."""
    import select

    try:
        s = connect(address)
        try:
            mm, fd = stalling_buffer(size, stall_at)
        except OSError as e:
            conn.send(("no-uffd", str(e)))
            return

        def helper():
            ready, _, _ = select.select([fd], [], [], 120)
            conn.send(("blocked",) if ready else ("never-blocked",))
            if conn.poll(300):
                conn.recv()
            os.close(fd)  # wakes the faulting copy

        th = threading.Thread(target=helper, daemon=True)
        th.start()
        rc = s.put(key, memoryview(mm))
        th.join(60)
        # It re-attaches by itself first.
        after = poll(lambda: s.put(key + "/after", b"a put after the stalled one"), interval=0.2,
                     done=lambda rc: rc == 0)
        s.close()
        conn.send(("done", rc, after))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def filler(conn, address, prefix, size):
    """Hard-pins objects of `size` bytes until the pool is full.
    -> ("filled", [keys])."""
    try:
        from mooncake_cxl import ReplicateConfig
        s = connect(address)
        cfg = ReplicateConfig()
        cfg.with_hard_pin = True
        keys = []
        for n in range(100_000):
            key = f"{prefix}{n}"
            rc = s.put(key, value_for(key, size), cfg)
            for _ in range(3):  # a transient failure (a re-attach) is retried
                if rc in (0, NO_AVAILABLE_HANDLE):
                    break
                rc = s.put(key, value_for(key, size), cfg)
            if rc != 0:
                break
            keys.append(key)
        s.close()
        conn.send(("filled", keys))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def check_objects(conn, address, keys, size):
    """Reads every key back in a fresh process. -> ("checked", [bad keys])."""
    try:
        s = connect(address)
        bad = [k for k in keys if s.get(k) != value_for(k, size)]
        s.close()
        conn.send(("checked", bad))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def ring_client_a(conn, address):
    """Client A: puts and reads back its own keys in a loop until told to
    stop; the test SIGSTOPs/SIGCONTs it meanwhile. -> ("attached",);
    <- "stop"; -> ("results", [(key, put rc, read back intact)])."""
    try:
        s = connect(address)
        conn.send(("attached",))
        results = []
        stop = threading.Event()

        def loop():
            i = 0
            while not stop.is_set():
                key = f"a/{i}"
                v = value_for(key, 4096 + (i % 7) * 1000)
                rc = s.put(key, v)
                results.append((key, rc, rc != 0 or s.get(key) == v))
                s.remove(key, True)  # keeps the pool from filling up
                i += 1

        th = threading.Thread(target=loop, daemon=True)
        th.start()
        conn.recv()
        stop.set()
        th.join(60)
        s.close()
        conn.send(("results", results))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def ring_client_b(conn, address, prefix, n):
    """Client B: attaches (-> ("attached",)), waits for "go", then n puts,
    each read back. -> ("results", [(key, put rc, read back intact)]); stays
    attached (holding its slot) until <- "exit"."""
    try:
        s = connect(address)
        conn.send(("attached",))
        conn.recv()
        results = []
        for i in range(n):
            key = f"{prefix}{i}"
            v = value_for(key, 4096 + (i % 5) * 3000)
            rc = s.put(key, v)
            results.append((key, rc, rc != 0 or s.get(key) == v))
        conn.send(("results", results))
        conn.poll(300)
        s.close()
    except BaseException:
        conn.send(("error", traceback.format_exc()))
