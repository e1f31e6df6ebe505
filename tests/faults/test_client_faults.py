"""A client process that dies in the middle of a put: the master reclaims its
unfinished extent, the puts it completed stay intact, and the key is free
for a new put. (Client deaths over the rings, and the pins of a dead client,
are in concurrency/test_rings.py and api/test_zero_copy_multiprocess.py;
master deaths in test_recovery.py.)

Every client is a spawned process (conftest's `children`); nothing asserts
on time.
"""
import os
import random
import signal
import time

import pytest

from conftest import CALL_TIMEOUT, CHILD_START_TIMEOUT, baseline_fill, connect, open_store, wait_for_space_back


pytestmark = pytest.mark.usefixtures("no_put_wait")


MiB = 1 << 20
KILL_VALUE = 4 * MiB
KILL_MAX_PUTS = 10  # 40 MiB: fits the 64 MiB pool with room for the in-flight put
KILL_AFTER = 3


def kill_value_parts(key, base):
    head = key.encode().ljust(64, b"#")
    return head, memoryview(base)[64:]


def _killed_putter(conn, address):
    s = open_store(address)
    base = random.Random("kill-base").randbytes(KILL_VALUE)
    for i in range(KILL_MAX_PUTS):
        key = f"kill/{i}"
        head, tail = kill_value_parts(key, base)
        rc = s.put_parts(key, head, tail)
        if rc != 0:
            conn.send(("failed", key, rc))
            break
        conn.send(("done", key))  # reported before the next put starts
    conn.send(("idle",))
    time.sleep(CALL_TIMEOUT)  # wait to be killed
    return "not killed"


def test_client_killed_mid_put_is_reclaimed(master, children):
    s = connect(master)
    try:
        baseline = baseline_fill(s)
        child = children(_killed_putter, master.address)
        done, other = [], []
        while len(done) < KILL_AFTER:
            msg = child.recv(CHILD_START_TIMEOUT)
            if msg[0] == "done":
                done.append(msg[1])
            else:
                raise AssertionError(f"putter child reported {msg} before {KILL_AFTER} puts")
        child.kill()  # SIGKILL, most likely while it copies the next value
        assert child.proc.exitcode == -signal.SIGKILL
        # Keys reported before the kill may still sit in the pipe.
        try:
            while child.conn.poll(0):
                msg = child.conn.recv()
                if msg[0] == "done":
                    done.append(msg[1])
                else:
                    other.append(msg)
        except (EOFError, OSError):
            pass

        base = random.Random("kill-base").randbytes(KILL_VALUE)
        for key in done:
            head, tail = kill_value_parts(key, base)
            got = s.get(key)
            assert len(got) == KILL_VALUE, f"{key}: reported complete, get returned {len(got)} bytes"
            assert got == head + bytes(tail), f"{key}: reported complete, content differs"

        # The master must notice the dead client and free its unfinished
        # extent: poll (a hang guard, not a timing assertion).
        wait_for_space_back(s, baseline, master, "reclaim of the killed client's unfinished put")
        # Informational: whether the kill landed inside a put this time (the
        # test below makes that case deterministic).
        print("killed mid-put:", "revoked unfinished put" in master.log_tail(100_000))
    finally:
        s.close()


def _dies_during_copy(conn, address, path):
    """Puts from a mapping whose second half lies past the end of its file: the
    client's copy into the pool faults (SIGBUS) after PutStart, so the process
    dies with its entry WRITING and its extent allocated."""
    import mmap
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from the SIGBUS
    s = open_store(address)
    assert s.put("copy/ok", b"fine") == 0
    with open(path, "w+b") as f:
        f.truncate(2 * KILL_VALUE)
        mm = mmap.mmap(f.fileno(), 2 * KILL_VALUE)
        mm[:KILL_VALUE] = random.Random("copy").randbytes(KILL_VALUE)
        f.truncate(KILL_VALUE)  # pages past KILL_VALUE now raise SIGBUS
    conn.send(("putting",))
    rc = s.put("copy/doomed", mm)
    return f"survived the faulting copy, put returned {rc}"


def test_client_dying_during_its_copy_is_reclaimed(master, children, tmp_path):
    s = connect(master)
    try:
        baseline = baseline_fill(s)
        path = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path),
                            f"mcxl_sigbus_{os.getpid()}_{time.monotonic_ns()}")
        try:
            child = children(_dies_during_copy, master.address, path)
            assert child.recv(CHILD_START_TIMEOUT) == ("putting",)
            child.proc.join(CALL_TIMEOUT)
            assert child.proc.exitcode == -signal.SIGBUS, (
                f"the child was expected to die of SIGBUS in its copy; exit code {child.proc.exitcode}")
        finally:
            if os.path.exists(path):
                os.unlink(path)
        assert s.get("copy/ok") == b"fine"
        assert s.is_exist("copy/doomed") == 0, "a put whose client died mid-copy became visible"
        assert s.get("copy/doomed") == b""
        wait_for_space_back(s, baseline, master, "reclaim of the dead client's unfinished put")
        # The key is free for a new put.
        assert s.put("copy/doomed", b"second try") == 0
        assert s.get("copy/doomed") == b"second try"
    finally:
        s.close()
