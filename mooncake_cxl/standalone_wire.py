"""The wire protocol between the standalone client (standalone.py, the
server) and dummy clients (dummy.py): one request per connection, a JSON
object on one line of at most MAX_REQUEST bytes with its newline, e.g.
{"op": "config", "v": 1}; the reply is one JSON line of at most MAX_REPLY
bytes, {"ok": true, ...} or {"ok": false, "error": "..."}.

The dummy's side lives here: the address it is given, the request, and the
check of every field of a config reply (type and length) before use.
"""
import json
import socket

from .setup_args import PROTOCOLS

PROTOCOL_VERSION = 1
MAX_REQUEST = 4096
MAX_REPLY = 64 * 1024
MAX_FIELD = 4096          # any string field of a reply


def encode(obj):
    """One protocol line."""
    return json.dumps(obj).encode() + b"\n"


def parse_server_address(address):
    """(host, port) from "host:port" ("[v6]:port" too); None when malformed."""
    if not isinstance(address, str) or len(address) > 512:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def request(host, port, op, timeout_s):
    """One request to a standalone client: (reply dict, None) or (None, why)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            s.sendall(encode({"op": op, "v": PROTOCOL_VERSION}))
            data = b""
            while b"\n" not in data:
                chunk = s.recv(MAX_REPLY + 1 - len(data))
                if not chunk:
                    return None, "it closed the connection without a whole reply"
                data += chunk
                if len(data) > MAX_REPLY and b"\n" not in data:
                    return None, f"its reply is longer than {MAX_REPLY} bytes"
    except socket.timeout:
        return None, f"no answer within {timeout_s:g} s"
    except OSError as e:
        return None, e.strerror or str(e)
    try:
        reply = json.loads(data.split(b"\n", 1)[0].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, "its reply is not JSON"
    if not isinstance(reply, dict):
        return None, "its reply is not a JSON object"
    if reply.get("ok") is not True:
        return None, f"it answered an error: {str(reply.get('error'))[:200]}"
    return reply, None


def check_config(reply):
    """The fields a dummy uses, type- and length-checked: (config, None) or (None, why)."""
    out = {}
    for name in ("master_server_addr", "protocol", "host", "tenant_id", "pool_path"):
        v = reply.get(name, "")
        if not isinstance(v, str) or len(v) > MAX_FIELD or "\0" in v:
            return None, f"field {name!r} is not a string of at most {MAX_FIELD} bytes"
        out[name] = v
    size = reply.get("pool_size", 0)
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 1 << 63:
        return None, "field 'pool_size' is not a non-negative int"
    out["pool_size"] = size
    if not out["master_server_addr"]:
        return None, "it names no master"
    if out["protocol"].lower() not in PROTOCOLS:
        return None, f"unknown protocol {out['protocol'][:32]!r}"
    return out, None
