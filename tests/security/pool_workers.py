"""Child-process bodies for test_pool_corruption.py (spawned: importable).

Each is a separate client process: one corrupts the pool with plain 8-byte
stores through its own mmap (what any process that can map the pool can do),
the others use the store normally and report what they saw."""
import mmap
import os
import struct
import time


def connect(address, transport="ring"):
    os.environ["MC_CXL_RPC"] = transport
    from mooncake_cxl import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address)
    return s, rc


# layout.h offsets (x86-64), used only when _core._layout() lacks one (a
# build from before these keys were exported, to show the tests fail there).
_LAYOUT_FALLBACK = {
    "superblock.pool_size": 32, "superblock.index_offset": 96, "superblock.index_capacity": 104,
    "superblock.data_offset": 112, "superblock.data_size": 120, "entry.state_gen": 8,
    "entry.object_offset": 24, "entry.value_size": 32, "entry_size": 64, "header.key_len": 64,
    "header_size": 80,
}


def layout():
    from mooncake_cxl import _core
    return {**_LAYOUT_FALLBACK, **_core._layout()}


def value_for(key, size=3000):
    return (key.encode() * (size // len(key) + 1))[:size]


def find_entry(pool_path, key):
    """(entry offset, object offset) of the COMPLETE index entry whose header
    names `key`, found by scanning the index as laid out in layout.h."""
    lay = layout()
    with open(pool_path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        try:
            u64 = lambda off: struct.unpack_from("<Q", mm, off)[0]
            index_offset = u64(lay["superblock.index_offset"])
            capacity = u64(lay["superblock.index_capacity"])
            esize = lay["entry_size"]
            want = key.encode()
            for slot in range(capacity):
                e = index_offset + slot * esize
                if u64(e + lay["entry.state_gen"]) & 0xFF != 3:  # kComplete
                    continue
                obj = u64(e + lay["entry.object_offset"])
                klen = struct.unpack_from("<I", mm, obj + lay["header.key_len"])[0]
                start = obj + lay["header_size"]
                if klen == len(want) and mm[start:start + klen] == want:
                    return e, obj
        finally:
            mm.close()
    raise AssertionError(f"no entry for {key}")


def corrupt(pool_path, key, field, value):
    """Writes `value` (8 bytes; 4 for key_len) into the entry or header of `key`."""
    lay = layout()
    entry, obj = find_entry(pool_path, key)
    off, fmt = {
        "object_offset": (entry + lay["entry.object_offset"], "<Q"),
        "value_size": (entry + lay["entry.value_size"], "<Q"),
        "key_len": (obj + lay["header.key_len"], "<I"),
    }[field]
    with open(pool_path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        struct.pack_into(fmt, mm, off, value)
        mm.close()


def corrupter(pool_path, key, field, value, q):
    """A separate process makes the one bad store, then reports."""
    corrupt(pool_path, key, field, value)
    q.put("corrupted")


def superblock_write(pool_path, field, value):
    lay = layout()
    with open(pool_path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        old = struct.unpack_from("<Q", mm, lay["superblock." + field])[0]
        struct.pack_into("<Q", mm, lay["superblock." + field], value)
        mm.close()
    return old


def setup_code(address, q):
    """Setup of a fresh client: its return code (the process must survive)."""
    s, rc = connect(address)
    if rc == 0:
        got = s.get("sb/0")
        q.put((rc, got == value_for("sb/0")))
        s.close()
    else:
        q.put((rc, None))


def reader(address, transport, keys, victim, q):
    """Another client: reads every intact key, the corrupt one, puts new keys."""
    s, rc = connect(address, transport)
    assert rc == 0
    bad = [k for k in keys if s.get(k) != value_for(k)]
    victim_get = s.get(victim)
    victim_exist = s.is_exist(victim)
    victim_view = s.get_buffer(victim)
    puts = [s.put(f"new/{transport}/{i}", value_for(f"new/{transport}/{i}")) for i in range(20)]
    q.put((bad, victim_get, victim_exist, victim_view is None, puts))
    s.close()


def shrink_victim(address, transport, keys, q):
    """Reads in a loop until told the pool shrank, then reports the return
    codes of each call: it must get errors, not die of SIGBUS."""
    s, rc = connect(address, transport)
    assert rc == 0
    q.put("ready")
    deadline = time.monotonic() + 30
    errors = 0
    while time.monotonic() < deadline and errors < 50:
        for k in keys:
            v = s.get(k)
            if v != value_for(k, 64 << 10):
                assert v == b"", "a get returned bytes that are not the value"
                errors += 1
    results = {
        "get": s.get(keys[0]),
        "is_exist": s.is_exist(keys[0]),
        "get_size": s.get_size(keys[0]),
        "put": s.put("after/shrink", b"x" * 4096),
        "view": s.get_buffer(keys[0]) is None,
    }
    q.put(results)
    s.close()
