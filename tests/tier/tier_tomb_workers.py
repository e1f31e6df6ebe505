"""Child processes of test_tier_tombstones.py (spawned: importable by name)."""
import time

from conftest import open_store


def keep_putting(conn, address, prefix, size, seconds):
    """Puts `size`-byte values until `seconds` pass or the master is gone, so
    that the tier thread is busy demoting (4 MiB writes) while the parent
    removes; says "going" after the first few puts."""
    s = open_store(address)
    value = b"x" * size
    deadline = time.monotonic() + seconds
    i = fails = rc = 0
    while time.monotonic() < deadline and fails < 3:
        rc = s.put(f"{prefix}{i}", value)
        fails = fails + 1 if rc != 0 else 0
        i += 1
        if i == 4:
            conn.send("going")
    return i, rc
