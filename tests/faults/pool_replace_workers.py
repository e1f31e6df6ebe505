"""Child bodies for tests/faults/test_pool_replaced.py."""
from conftest import open_store


def old_client(conn, address):
    """A client of the first pool: puts, then waits; after the test replaced
    the device, reports what its calls answer."""
    s = open_store(address)
    conn.send(("put", s.put("old-key", b"old-value")))
    assert conn.recv() == "replaced"
    conn.send(("after", s.put("late", b"v"), s.remove("old-key", True)))
    s.close()
    return "done"
