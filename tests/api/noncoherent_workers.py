"""Children of test_noncoherent.py (spawned: a fresh interpreter each)."""
from conftest import open_store


def value(i):
    return bytes([i % 251]) * (64 + 37 * i)


def write_all(conn, address, n):
    s = open_store(address)
    try:
        return sum(s.put(f"nc{i}", value(i)) == 0 for i in range(n))
    finally:
        s.close()


def read_all(conn, address, n):
    s = open_store(address)
    try:
        return sum(s.get(f"nc{i}") == value(i) for i in range(n))
    finally:
        s.close()
