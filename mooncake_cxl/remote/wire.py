"""The master's wire format (cpp/control message.h, rpc_protocol.h) for the
requests a remote client sends: frames, and each request's and reply's codec.
Decoders check lengths and raise WireError on a short or malformed reply."""
import struct

FRAME_MAGIC = 0x4D43584C
PROTOCOL_VERSION = 8
_HEADER = struct.Struct("<IHHIIQ")
HEADER_BYTES = _HEADER.size
MAX_PAYLOAD = 64 << 20

PING, ATTACH, DETACH, PUT_START, REMOVE, BATCH_REMOVE = 1, 2, 3, 4, 5, 6
REMOVE_BY_REGEX, REMOVE_ALL, HEARTBEAT, PROMOTE, SETTLE = 7, 8, 9, 10, 11
ANNOUNCE_OPEN, ANNOUNCE_CLOSE, LOCATE, PUBLISH = 12, 13, 14, 15

MAX_REQUEST_KEYS = 4096
LOCATE_TO_VALIDATE = 1  # kLocateToValidate: a re-check, not a second read
LOCATE_PEEK = 2  # kLocatePeek: no lease, not a read


class WireError(Exception):
    pass


class Encoder:
    def __init__(self):
        self.parts = []

    def u8(self, v):
        self.parts.append(struct.pack("<B", v))
        return self

    def u32(self, v):
        self.parts.append(struct.pack("<I", v))
        return self

    def u64(self, v):
        self.parts.append(struct.pack("<Q", v))
        return self

    def raw(self, b):
        self.parts.append(bytes(b))
        return self

    def str(self, s):
        b = s.encode() if isinstance(s, str) else bytes(s)
        self.parts.append(struct.pack("<I", len(b)))
        self.parts.append(b)
        return self

    def ref(self, ref):
        return self.u32(ref[0]).u64(ref[1])

    def bytes(self):
        return b"".join(self.parts)


class Decoder:
    def __init__(self, data):
        self.data = memoryview(data)
        self.pos = 0

    def _take(self, n):
        if self.pos + n > len(self.data):
            raise WireError("short reply")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def i32(self):
        return struct.unpack("<i", self._take(4))[0]

    def u32(self):
        return struct.unpack("<I", self._take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self._take(8))[0]

    def raw(self, n):
        return bytes(self._take(n))

    def str(self):
        return bytes(self._take(self.u32()))

    def count(self, min_item):
        n = self.u32()
        if n * min_item > len(self.data) - self.pos:
            raise WireError("count past the reply")
        return n


def frame(mtype, request_id, payload):
    return _HEADER.pack(FRAME_MAGIC, PROTOCOL_VERSION, mtype, len(payload), 0, request_id) + payload


def parse_header(b):
    magic, version, mtype, n, _, rid = _HEADER.unpack(b)
    if magic != FRAME_MAGIC or version != PROTOCOL_VERSION or n > MAX_PAYLOAD:
        raise WireError(f"bad frame header (magic {magic:#x}, version {version})")
    return mtype, n, rid


# ---- requests ----

def recv_exact(sock, n):
    """n bytes from sock; OSError when the master closes it first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise OSError("closed by the master")
        got += k
    return bytes(buf)


def recv_reply(sock):
    """The payload of the next frame on sock."""
    _, n, _ = parse_header(recv_exact(sock, HEADER_BYTES))
    return recv_exact(sock, n)

def attach(hostname, machine, pid, prev_slot, prev_gen, tenant, secret):
    return (Encoder().str(hostname).str(machine).u64(pid).u32(prev_slot).u64(prev_gen)
            .raw(bytes(16)).str(tenant).str(secret).u64(0).str("").bytes())  # no DRAM segment


def put_start(ref, put_id, abandoned, upsert, flags, soft_pin_ttl_ms, keys, sizes, groups):
    e = Encoder().ref(ref).u64(put_id).u32(len(abandoned))
    for a in abandoned:
        e.u64(a)
    e.u8(1 if upsert else 0).u32(flags).u64(soft_pin_ttl_ms).u8(0).u32(len(keys))  # pool placement: no segment named
    for k, n, g in zip(keys, sizes, groups):
        e.str(k).u64(n).str(g)
    return e.bytes()


def remove(ref, keys, force):
    e = Encoder().ref(ref).u8(1 if force else 0).u32(len(keys))
    for k in keys:
        e.str(k)
    return e.bytes()


def remove_matching(ref, pattern, force):
    return Encoder().ref(ref).u8(1 if force else 0).str(pattern).bytes()


def locate(ref, keys, lease_until_ns=0):
    e = Encoder().ref(ref).u64(lease_until_ns).u32(len(keys))
    for k in keys:
        e.str(k)
    return e.bytes()


def publish(ref, items):
    e = Encoder().ref(ref).u32(len(items))
    for slot, gen in items:
        e.u64(slot).u64(gen)
    return e.bytes()


def settle(ref, items):
    e = Encoder().ref(ref).u32(len(items))
    for k, gen in items:
        e.str(k).u64(gen)
    return e.bytes()


def announce_open(ref, name):
    return Encoder().ref(ref).str(name).bytes()


def announce_close(ref, channel, name_hash):
    return Encoder().ref(ref).u32(channel).u64(name_hash).bytes()


def ref_only(ref):
    return Encoder().ref(ref).bytes()


# ---- replies ----

def status_of(payload):
    return Decoder(payload).i32()


def ping_reply(p):
    d = Decoder(p)
    return {"status": d.i32(), "incarnation": d.u64(), "pool_path": d.str().decode(errors="replace"),
            "pool_size": d.u64(), "uuid": d.raw(16)}


def attach_reply(p):
    d = Decoder(p)
    r = {"status": d.i32(), "slot": d.u32(), "generation": d.u64(), "incarnation": d.u64(),
         "pool_path": d.str().decode(errors="replace"), "pool_size": d.u64(), "uuid": d.raw(16),
         "lease_ttl_ms": d.u64()}
    if r["status"] == 0:
        r.update(te_protocol=d.str().decode(errors="replace"), te_session=d.str().decode(errors="replace"),
                 index_offset=d.u64(), index_capacity=d.u64(), tombs_word_offset=d.u64())
    return r


def put_start_reply(p):
    d = Decoder(p)
    status = d.i32()
    items = []
    for _ in range(d.count(29)):
        st, slot, gen, off, flags = d.i32(), d.u64(), d.u64(), d.u64(), d.raw(1)[0]
        if flags & 2:  # placed in a segment: a remote putter asks for none
            d.u32(), d.u64()
        items.append((st, slot, gen, off, (flags & 1) != 0))
    return status, items  # (status, entry_slot, generation, value_offset, settle)


def per_key_reply(p):
    """A status, one code per key, and a ticket: the reply of Remove and Publish."""
    d = Decoder(p)
    status = d.i32()
    results = [d.i32() for _ in range(d.count(4))]
    return status, results, d.u64()


remove_reply = publish_reply = per_key_reply


def count_reply(p):
    d = Decoder(p)
    return d.i32(), d.u64(), d.u64()


def locate_reply(p):
    d = Decoder(p)
    status = d.i32()
    items = []
    for _ in range(d.count(56)):
        items.append((d.i32(), d.u64(), d.u64(), d.u64(), d.u64(), d.u64(), d.u64(),
                      d.str().decode(errors="replace")))
    # (status, entry_offset, version, state_gen, value_offset, value_size, put_time_ns, writer)
    return status, items


def announce_open_reply(p):
    d = Decoder(p)
    return d.i32(), d.u32(), d.u64()  # (status, channel, name_hash)


def ticket_reply(p):
    d = Decoder(p)
    return d.i32(), d.u64()
