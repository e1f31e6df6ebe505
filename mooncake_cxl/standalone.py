"""The standalone client `mooncake_cxl_client` and the dummy client that uses it
(Mooncake's `mooncake_client` + `setup_dummy`, as SGLang's and vLLM's
"standalone" modes start them: one standalone client per host, engine
processes attached to it with setup_dummy(mem_pool_size, local_buffer_size,
"host:port")).

Contract:
  * The standalone client is a normal client of the master (it set up with its
    flags, so a bad master address or an unreadable pool fails at start, exit
    1) and a configuration relay: it serves, on 127.0.0.1:--port only, the
    master's address, the protocol, the tenant, this host's name and this
    host's pool path hint (MC_CXL_DEV_PATH / MC_CXL_DEV_SIZE with
    protocol=cxl). Nothing it serves is a credential: the pool's access token
    stays in the pool, so a dummy that cannot map the pool cannot attach.
  * A dummy client fetches that once in setup_dummy and then is a normal client
    of the master: it maps the pool itself, so its data path stays one-sided
    and it keeps working if the standalone client exits afterwards. Every data
    method works on a dummy client (the reference's dummy lacks some).
  * Wire protocol (one request per connection): a JSON object on one line,
    at most MAX_REQUEST bytes with its newline, e.g. {"op": "config", "v": 1};
    the reply is one JSON line of at most MAX_REPLY bytes, {"ok": true, ...}
    or {"ok": false, "error": "..."}. The server closes a connection that is
    idle for CONN_TIMEOUT_S or sends more than MAX_REQUEST bytes without a
    newline, and serves at most MAX_CONNECTIONS at once (more are closed at
    once). The dummy checks every field's type and length before use.
  * setup_dummy returns RPC_FAIL (-900) with one log line when the standalone
    client cannot be reached or answers garbage (the reference returns -1),
    INVALID_PARAMS (-600) for a malformed server_address, else setup's code.
  * alloc_from_mem_pool(size) maps anonymous memory, registers it with this
    client (register_buffer of exactly that range again returns 0, as the
    reference expects after an alloc) and returns its address; 0 when it
    cannot (before setup, size 0, mmap failure). The memory lives until the
    process exits, as the reference's shared regions do.
"""
import argparse
import ctypes
import json
import logging
import mmap
import os
import signal
import socket
import sys
import threading

from .errors import ErrorCode
from .sizes import parse_size

log = logging.getLogger("mooncake_cxl")

PROTOCOL_VERSION = 1
MAX_REQUEST = 4096
MAX_REPLY = 64 * 1024
MAX_CONNECTIONS = 16
CONN_TIMEOUT_S = 2.0
_MAX_FIELD = 4096          # any string field of a reply
_PROTOCOLS = ("tcp", "rdma", "cxl", "")

RPC_FAIL = int(ErrorCode.RPC_FAIL)
INVALID = int(ErrorCode.INVALID_PARAMS)
_NOT_SUPPORTED = int(ErrorCode.NOT_SUPPORTED)


def _host_name(host):
    """The host part of this host's clients' names: --host, or the machine's
    name when --host is a wildcard (the reference's default is 0.0.0.0)."""
    return socket.gethostname() if host in ("", "0.0.0.0", "::") else host


# ------------------------------------------------------------------ the server

class StandaloneServer:
    """Serves `config` (a dict of JSON values) on 127.0.0.1:port."""

    def __init__(self, config, port, bind="127.0.0.1"):
        self.config = dict(config)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((bind, port))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._stop = threading.Event()
        self._refused = 0

    def serve_forever(self):
        self.sock.settimeout(0.5)  # so that stop() is noticed
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stop.is_set():
                    break
                raise
            if not self._slots.acquire(blocking=False):
                self._refused += 1
                if self._refused in (1, 10, 100) or self._refused % 1000 == 0:
                    log.warning("mooncake_cxl_client: %d connections refused: %d already open",
                                self._refused, MAX_CONNECTIONS)
                conn.close()
                continue
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()

    def stop(self):
        self._stop.set()
        try:
            self.sock.close()
        except OSError:
            pass

    def _serve_one(self, conn):
        try:
            conn.settimeout(CONN_TIMEOUT_S)
            data = b""
            while b"\n" not in data:
                chunk = conn.recv(MAX_REQUEST + 1 - len(data))
                if not chunk:
                    return  # closed before a whole request: nothing to answer
                data += chunk
                if len(data) > MAX_REQUEST and b"\n" not in data:
                    self._reply(conn, {"ok": False, "error": f"request longer than {MAX_REQUEST} bytes"})
                    return
            self._reply(conn, self.handle(data.split(b"\n", 1)[0]))
        except (socket.timeout, OSError):
            pass
        finally:
            conn.close()
            self._slots.release()

    def handle(self, line):
        try:
            req = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return {"ok": False, "error": "request is not a JSON object"}
        if not isinstance(req, dict):
            return {"ok": False, "error": "request is not a JSON object"}
        op = req.get("op")
        if op == "ping":
            return {"ok": True, "v": PROTOCOL_VERSION}
        if op == "config":
            return {"ok": True, "v": PROTOCOL_VERSION, **self.config}
        return {"ok": False, "error": f"unknown op {str(op)[:64]!r} (known: config, ping)"}

    @staticmethod
    def _reply(conn, obj):
        conn.sendall(json.dumps(obj).encode() + b"\n")


# ------------------------------------------------------------ the dummy's side

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
            s.sendall(json.dumps({"op": op, "v": PROTOCOL_VERSION}).encode() + b"\n")
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
        if not isinstance(v, str) or len(v) > _MAX_FIELD or "\0" in v:
            return None, f"field {name!r} is not a string of at most {_MAX_FIELD} bytes"
        out[name] = v
    size = reply.get("pool_size", 0)
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 1 << 63:
        return None, "field 'pool_size' is not a non-negative int"
    out["pool_size"] = size
    if not out["master_server_addr"]:
        return None, "it names no master"
    if out["protocol"].lower() not in _PROTOCOLS:
        return None, f"unknown protocol {out['protocol'][:32]!r}"
    return out, None


_REGIONS_LOCK = threading.Lock()
_REGIONS = []  # (mmap, address, size): alloc_from_mem_pool memory, kept until the process exits


def _env_ms(name, default):
    v = os.environ.get(name, "")
    return int(v) if v.isdigit() else default


class DummyMethods:
    """Mixed into MooncakeDistributedStore: setup_dummy, init_all, alloc_from_mem_pool."""

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        """Attach through the standalone client (mooncake_cxl_client) at
        server_address ("host:port"): fetch the master's address and this
        host's pool settings from it, then set up as a normal client that maps
        the pool itself. mem_pool_size (what alloc_from_mem_pool will hand out)
        and local_buffer_size (the reference's staging buffer; values go
        straight into the pool here) are accepted for compatibility.
        Returns 0, RPC_FAIL (-900) if the standalone client cannot be
        reached, INVALID_PARAMS (-600), or setup()'s code."""
        for name, v in (("mem_pool_size", mem_pool_size), ("local_buffer_size", local_buffer_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise TypeError(f"setup_dummy(): {name} must be a non-negative int, not {v!r}")
        if not isinstance(server_address, str):
            raise TypeError(f"setup_dummy(): server_address must be str, not "
                            f"{type(server_address).__name__}")
        hp = parse_server_address(server_address)
        if hp is None:
            log.error("setup_dummy(): server_address %r is not host:port", server_address[:100])
            return INVALID
        timeout_s = _env_ms("MC_CXL_CONNECT_TIMEOUT_MS", 3000) / 1000
        reply, why = request(hp[0], hp[1], "config", timeout_s)
        cfg = None
        if reply is not None:
            cfg, why = check_config(reply)
        if cfg is None:
            log.error("setup_dummy(): no usable standalone client at %s: %s (start one with "
                      "mooncake_cxl_client --port=%d --master_server_address=...)",
                      server_address, why, hp[1])
            return RPC_FAIL
        hint = (cfg["pool_path"], cfg["pool_size"]) if cfg["pool_path"] else None
        # TODO(tenants, issue 12 item 6): pass cfg["tenant_id"] once setup honours tenant_id.
        rc = self._setup(_host_name(cfg["host"]), cfg["protocol"], cfg["master_server_addr"],
                         None, pool_hint=hint)
        if rc == 0:
            self._mem_pool_budget = mem_pool_size
            log.info("setup_dummy(): attached through %s to master %s (tenant %s)",
                     server_address, cfg["master_server_addr"], cfg["tenant_id"] or "default")
        return rc

    def init_all(self, protocol, device_name, mount_segment_size=16 * 1024 * 1024, /):
        """Mooncake's one-call bring-up: setup("localhost", ...) against the
        master at 127.0.0.1:50051 (MC_CXL_MASTER_ADDR overrides, ours). A
        store already set up gets INVALID_PARAMS (-600), as the reference's
        "already initialized"."""
        if not isinstance(protocol, str) or not isinstance(device_name, str):
            raise TypeError("init_all(protocol: str, device_name: str, mount_segment_size: int)")
        if not isinstance(mount_segment_size, int) or mount_segment_size < 0:
            raise TypeError("init_all(): mount_segment_size must be a non-negative int")
        if self.health_check() != 1:  # 1: not set up
            log.error("init_all(): this store is already set up; close() it first")
            return INVALID
        master = os.environ.get("MC_CXL_MASTER_ADDR") or "127.0.0.1:50051"
        return self._setup("localhost", protocol, master)

    def alloc_from_mem_pool(self, size, /):
        """Memory for zero-copy calls: `size` bytes, registered with this client;
        its address, or 0 (before setup, size 0, out of memory) with a log line."""
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise TypeError(f"alloc_from_mem_pool(): size must be a non-negative int, not {size!r}")
        if size == 0:
            log.error("alloc_from_mem_pool(0): size is 0")
            return 0
        if self.health_check() == 1:  # 1: not set up
            log.error("alloc_from_mem_pool(%d): this store is not set up; call setup_dummy() or "
                      "setup() first", size)
            return 0
        try:
            m = mmap.mmap(-1, size)  # MAP_SHARED | MAP_ANONYMOUS, zero-filled
        except (OSError, OverflowError, ValueError) as e:
            log.error("alloc_from_mem_pool(%d): cannot map that much memory: %s", size, e)
            return 0
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))  # the export also forbids m.close()
        with _REGIONS_LOCK:
            _REGIONS.append((m, addr, size))
            used = sum(r[2] for r in _REGIONS)
        budget = getattr(self, "_mem_pool_budget", 0)
        if budget and used > budget:
            log.warning("alloc_from_mem_pool(%d): %d bytes handed out, more than setup_dummy's "
                        "mem_pool_size %d (not enforced)", size, used, budget)
        if super().register_buffer(addr, size) == 0:
            self._auto_registered()[addr] = size
        return addr

    def _auto_registered(self):
        d = self.__dict__.get("_mem_pool_auto")
        if d is None:
            d = self.__dict__["_mem_pool_auto"] = {}
        return d

    def register_buffer(self, buffer_ptr, size):
        if self._auto_registered().get(buffer_ptr) == size:
            return 0  # alloc_from_mem_pool registered exactly this range already
        return super().register_buffer(buffer_ptr, size)

    def unregister_buffer(self, buffer_ptr):
        rc = super().unregister_buffer(buffer_ptr)
        if rc == 0:
            self._auto_registered().pop(buffer_ptr, None)
        return rc

    def close(self):
        self._auto_registered().clear()  # the client's registrations end with it
        return super().close()


# ------------------------------------------------------- mooncake_cxl_client

def _bool(text):
    t = str(text).strip().lower()
    if t in ("1", "true", "t", "yes", "y"):
        return True
    if t in ("0", "false", "f", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"not a bool: {text!r}")


_BOOL_FLAGS = ("enable_offload", "start_offload_rpc_server")


def _gflags_argv(argv):
    """gflags spellings into argparse's: -flag -> --flag, --noflag -> --flag=false."""
    out = []
    for a in argv:
        if a.startswith("-") and not a.startswith("--") and len(a) > 2:
            a = "-" + a
        name = a[2:].split("=", 1)[0] if a.startswith("--") else ""
        if name.startswith("no") and name[2:] in _BOOL_FLAGS and "=" not in a:
            a = f"--{name[2:]}=false"
        out.append(a)
    return out


def parse_flags(argv):
    p = argparse.ArgumentParser(
        prog="mooncake_cxl_client", allow_abbrev=False,
        description="The standalone client of a mooncake_cxl pool (Mooncake's mooncake_client): "
                    "a client of the master that tells dummy clients (setup_dummy) of this host "
                    "how to attach. Serves on 127.0.0.1 only.")
    p.add_argument("--host", default="0.0.0.0",
                   help="this host's name for its clients (0.0.0.0: the machine's name)")
    p.add_argument("--port", type=int, default=50052,
                   help="service port on 127.0.0.1 (0: any free port)")
    p.add_argument("--master_server_address", default="127.0.0.1:50051")
    p.add_argument("--protocol", default="tcp", help="cxl, tcp or rdma: all map the pool")
    p.add_argument("--tenant_id", default="default")
    p.add_argument("--metadata_server", default="http://127.0.0.1:8080/metadata",
                   help="accepted; a CXL pool needs no metadata service")
    p.add_argument("--device_names", default="", help="accepted; no NICs are used")
    p.add_argument("--global_segment_size", default="4 GB",
                   help="accepted (validated); the pool is the master's segment")
    p.add_argument("--local_buffer_size", default="0", help="accepted (validated); values go "
                                                            "straight into the pool")
    p.add_argument("--threads", type=int, default=1, help="accepted; one thread serves")
    for name in _BOOL_FLAGS:
        p.add_argument(f"--{name}", type=_bool, nargs="?", const=True,
                       default=name == "start_offload_rpc_server",
                       help="accepted; there is no offload tier")
    args = p.parse_args(_gflags_argv(argv))
    for name in ("global_segment_size", "local_buffer_size"):
        if parse_size(getattr(args, name)) is None:
            p.error(f"--{name}={getattr(args, name)!r} is not a size (e.g. 4GB, 16 MB, 1048576)")
    if not 0 <= args.port < 65536:
        p.error(f"--port={args.port} is not a port")
    if args.protocol.lower() not in _PROTOCOLS:
        p.error(f"--protocol={args.protocol!r}: use cxl, tcp or rdma")
    return args


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_flags(sys.argv[1:] if argv is None else argv)
    if args.enable_offload:
        log.warning("mooncake_cxl_client: --enable_offload ignored: there is no offload tier")
    from .store import MooncakeDistributedStore, _with_port
    store = MooncakeDistributedStore()
    host = _host_name(args.host)
    rc = store.setup(_with_port(host), args.metadata_server, parse_size(args.global_segment_size),
                     parse_size(args.local_buffer_size), args.protocol, args.device_names,
                     args.master_server_address, tenant_id=args.tenant_id)
    if rc != 0:
        print(f"mooncake_cxl_client: setup against the master at {args.master_server_address} "
              f"failed with {rc}", file=sys.stderr, flush=True)
        return 1
    cxl = args.protocol.lower() == "cxl"
    config = {
        "master_server_addr": args.master_server_address, "protocol": args.protocol,
        "host": args.host, "tenant_id": args.tenant_id,
        "pool_path": os.environ.get("MC_CXL_DEV_PATH", "") if cxl else "",
        "pool_size": _env_ms("MC_CXL_DEV_SIZE", 0) if cxl else 0,
    }
    try:
        server = StandaloneServer(config, args.port)
    except OSError as e:
        print(f"mooncake_cxl_client: cannot listen on 127.0.0.1:{args.port}: {e.strerror or e}",
              file=sys.stderr, flush=True)
        store.close()
        return 1

    def on_signal(signum, frame):
        server.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"mooncake_cxl_client ready port={server.port} master={args.master_server_address} "
          f"hostname={store.get_hostname()}", flush=True)
    try:
        server.serve_forever()
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
