"""Child bodies of the DRAM segment tests (test_dram_segments.py,
faults/test_segment_faults.py, remote/test_segment_te.py): a client with a
segment beside the pool (MC_CXL_DRAM_SEGMENT=1, global_segment_size > 0),
or a plain reader (segment 0), driven over its pipe. te: the segment's
Transfer Engine (MC_CXL_SEGMENT_TE), only inside a private network namespace."""
import os
import struct
import threading
import zlib

from mooncake_cxl import MooncakeDistributedStore, ReplicateConfig

SEGMENT = 64 << 20


def open_segment_store(address, hostname, segment=SEGMENT, te=False):
    os.environ["MC_CXL_DRAM_SEGMENT"] = "1" if segment else "0"
    os.environ["MC_CXL_SEGMENT_TE"] = "1" if te else "0"
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


def segment_owner(conn, address, hostname, stderr_path=None, segment=SEGMENT, te=False):
    """Serves requests from the pipe until ("exit",): put/get/desc/exist,
    the zero-copy reads and a race reader."""
    if stderr_path:
        fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
    s = open_segment_store(address, hostname, segment, te)
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
        elif op == "te_session":
            conn.send([r.te_session for r in s.get_replica_desc(req[1])])
        elif op == "churn":
            conn.send(churn(s, *req[1:]))
        elif op in ("get_into", "batch_get_into", "get_buffer", "read_race"):
            conn.send(_zero_copy_read(s, op, req[1:]))
        elif op == "exist":
            conn.send(s.is_exist(req[1]))
        elif op == "remove":
            conn.send(s.remove(req[1], True))  # forced: reads leased it


def _zero_copy_read(s, op, args):
    """get_into / batch_get_into (keys, buffer size) / get_buffer, through a
    registered buffer: (codes, values); read_race: read_until_stopped."""
    import ctypes
    if op == "read_race":
        return read_until_stopped(s, *args)
    if op == "get_buffer":
        b = s.get_buffer(args[0])
        return (0, b""), None if b is None else bytes(memoryview(b))
    keys, size = args
    buf = ctypes.create_string_buffer(size * len(keys))
    base = ctypes.addressof(buf)
    assert s.register_buffer(base, len(buf)) == 0
    try:
        if op == "get_into":
            rc = [s.get_into(keys[0], base, size)]
        else:
            rc = s.batch_get_into(keys, [base + i * size for i in range(len(keys))], [size] * len(keys))
        return rc, [buf.raw[i * size:i * size + max(0, r)] for i, r in enumerate(rc)]
    finally:
        s.unregister_buffer(base)


def read_judged(s, key, floor):
    """One get of `key`: ("miss", None), ("hit", version) or ("error", why):
    torn, or older than `floor` (a version already seen or published)."""
    v = s.get(key)
    if not v:
        return "miss", None
    try:
        got = check_versioned(v)
    except AssertionError as e:
        return "error", str(e)
    return ("error", f"stale: read {got} after {floor}") if got < floor else ("hit", got)


def read_until_stopped(s, key, rounds):
    """Reads `key` `rounds` times (and on to a first hit): every value must
    be whole (versioned) and none older than one read before it; returns (errors, hits, misses, the
    highest version seen)."""
    errors, hits, misses, top = [], 0, 0, 0
    # Past `rounds`, on until a hit (bounded): a reader over TE, slower than
    # the writer's upserts, may see each copy outdated (a miss) while it runs.
    for n in range(100 * rounds):
        if n >= rounds and hits:
            break
        what, got = read_judged(s, key, top)
        if what == "error":
            errors.append(got)
            break
        if what == "miss":
            misses += 1
        else:
            top, hits = got, hits + 1
    return errors, hits, misses, top


def churn(s, key, rounds, size, published=None):
    """Upserts versioned values 1..rounds of `key` into this client's
    segment (published[0] = the last one returned), removing it now and
    then; returns the errors."""
    errors = []
    for i in range(1, rounds + 1):
        if i % 17 == 0 and s.remove(key, True) not in (0, -704):  # forced: readers lease it
            errors.append(f"remove {i}")
        rc = s.upsert(key, versioned(i, size), config(same_node=True))
        if rc != 0:
            errors.append(f"upsert {i}: {rc}")
            break
        if published is not None:
            published[0] = i
    return errors


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
        errors.extend(churn(s, key, rounds, size, published))
        stop.set()

    reads = [0, 0]

    def reader():
        while not stop.is_set():
            what, got = read_judged(s, key, published[0])
            if what == "error":
                errors.append(got)
                return
            reads[0 if what == "hit" else 1] += 1

    t = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for x in t:
        x.start()
    for x in t:
        x.join()
    desc = [r.read_by for r in s.get_replica_desc(key)]
    s.close()
    return errors, reads, desc


# ---- the test side: a segment owner child and its requests ----

def start_owner(children, master, hostname, stderr_path=None, segment=SEGMENT, te=False):
    """A segment_owner child (conftest's `children` fixture), once it is set up."""
    c = children(segment_owner, master.address, hostname, stderr_path, segment, te)
    tag, name = c.recv()
    assert tag == "ready" and name == hostname, (tag, name)
    return c


def ask(child, *req):
    """One request to a segment_owner child and its answer."""
    child.conn.send(req)
    return child.recv()
