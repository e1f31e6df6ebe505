"""Child-process bodies for the CXL RPC ring tests (spawned: importable)."""
import os
import time


def connect(address, transport="ring"):
    os.environ["MC_CXL_RPC"] = transport
    from mooncake_cxl import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address) == 0
    return s


def put_remove_worker(address, wid, n, q):
    """Puts n keys, removes every other one; reports every return code."""
    s = connect(address)
    puts = [s.put(f"w{wid}/k{i}", f"w{wid}/v{i}".encode() * 10) for i in range(n)]
    removes = [s.remove(f"w{wid}/k{i}", force=True) for i in range(0, n, 2)]
    again = [s.remove(f"w{wid}/k{i}", force=True) for i in range(0, n, 2)]  # a duplicate would show here
    q.put((wid, puts, removes, again))
    s.close()


def hammer_then_wait(address, q, requests):
    """Issues requests in a loop until killed; reports that it started, and
    counts its requests in the shared `requests`."""
    s = connect(address)
    q.put("started")
    i = 0
    while True:
        s.put(f"hammer/{i}", b"h" * 4096)
        s.remove(f"hammer/{i}", force=True)
        i += 1
        requests.value = 2 * i


def attached_then_sleep(address, q):
    s = connect(address)
    q.put("attached")
    time.sleep(300)
