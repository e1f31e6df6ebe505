"""Child bodies of the DRAM segment tests (test_dram_segments.py,
faults/test_segment_faults.py): a client with a segment beside the pool
(MC_CXL_DRAM_SEGMENT=1, global_segment_size > 0), driven over its pipe."""
import os
import struct
import threading
import zlib

from mooncake_cxl import MooncakeDistributedStore, ReplicateConfig

SEGMENT = 64 << 20


def open_segment_store(address, hostname, segment=SEGMENT):
    os.environ["MC_CXL_DRAM_SEGMENT"] = "1"
    s = MooncakeDistributedStore()
    rc = s.setup(hostname, "P2PHANDSHAKE", segment, 0, "cxl", "", address)
    if rc != 0:
        raise RuntimeError(f"setup with a DRAM segment returned {rc}")
    return s


def config(preferred="", same_node=False):
    c = ReplicateConfig()
    c.preferred_segment = preferred
    c.prefer_alloc_in_same_node = same_node
    return c


def segment_owner(conn, address, hostname, stderr_path=None, segment=SEGMENT):
    """Serves requests from the pipe until ("exit",): put/get/desc/exist."""
    if stderr_path:
        fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
    s = open_segment_store(address, hostname, segment)
    conn.send(("ready", s.get_hostname()))
    while True:
        req = conn.recv()
        op = req[0]
        if op == "exit":
            s.close()
            return "closed"
        if op == "put":
            _, key, value, preferred, same_node = req
            conn.send(s.put(key, value, config(preferred, same_node)))
        elif op == "get":
            conn.send(s.get(req[1]))
        elif op == "desc":
            d = s.get_replica_desc(req[1])
            conn.send([(r.read_by, r.segment_name, r.offset, r.size) for r in d])
        elif op == "exist":
            conn.send(s.is_exist(req[1]))
        elif op == "remove":
            conn.send(s.remove(req[1], True))  # forced: reads leased it


def versioned(i, size):
    """Value i: its number, then bytes derived from it, then their crc32."""
    body = struct.pack("<Q", i) + bytes([i % 251]) * (size - 12)
    return body + struct.pack("<I", zlib.crc32(body))


def check_versioned(v):
    body, (crc,) = v[:-4], struct.unpack("<I", v[-4:])
    assert zlib.crc32(body) == crc, "torn value"
    return struct.unpack("<Q", body[:8])[0]


def upsert_remove_reader(conn, address, hostname, rounds, size):
    """Owner-side race: one thread upserts (and now and then removes) a
    segment object while another reads it. Every value read is whole, and
    never older than one whose upsert had returned before the read began."""
    s = open_segment_store(address, hostname)
    key = "race"
    published = [0]
    stop = threading.Event()
    errors = []

    def writer():
        for i in range(1, rounds + 1):
            if i % 17 == 0:
                assert s.remove(key, True) in (0, -704)  # forced: the reader leases it
            rc = s.upsert(key, versioned(i, size), config(same_node=True))
            if rc != 0:
                errors.append(f"upsert {i}: {rc}")
                break
            published[0] = i
        stop.set()

    reads = [0, 0]

    def reader():
        while not stop.is_set():
            floor = published[0]
            v = s.get(key)
            if not v:
                reads[1] += 1
                continue
            try:
                got = check_versioned(v)
            except AssertionError as e:
                errors.append(str(e))
                return
            if got < floor:
                errors.append(f"stale: read {got} after {floor} was published")
                return
            reads[0] += 1

    t = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for x in t:
        x.start()
    for x in t:
        x.join()
    desc = [r.read_by for r in s.get_replica_desc(key)]
    s.close()
    return errors, reads, desc


# ---- the test side: a segment owner child and its requests ----

def start_owner(children, master, hostname, stderr_path=None, segment=SEGMENT):
    """A segment_owner child (conftest's `children` fixture), once it is set up."""
    c = children(segment_owner, master.address, hostname, stderr_path, segment)
    tag, name = c.recv()
    assert tag == "ready" and name == hostname, (tag, name)
    return c


def ask(child, *req):
    """One request to a segment_owner child and its answer."""
    child.conn.send(req)
    return child.recv()
