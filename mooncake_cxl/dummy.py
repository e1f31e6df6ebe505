"""The dummy client: Mooncake's setup_dummy, as SGLang's and vLLM's
"standalone" modes use it (one standalone client per host, standalone.py;
engine processes attached to it with setup_dummy(mem_pool_size,
local_buffer_size, "host:port")), plus init_all and alloc_from_mem_pool.
Mixed into MooncakeDistributedStore as DummyMethods.

Contract:
  * A dummy client fetches the master's address and this host's pool path
    hint from its standalone client once, in setup_dummy (standalone_wire.py),
    and then is a normal client of the master: it maps the pool itself, so its
    data path stays one-sided and it keeps working if the standalone client
    exits afterwards. Every data method works on a dummy client (the
    reference's dummy lacks some).
  * setup_dummy returns RPC_FAIL (-900) with one log line when the standalone
    client cannot be reached or answers garbage (the reference returns -1),
    INVALID_PARAMS (-600) for a malformed server_address, else setup's code.
  * alloc_from_mem_pool(size) maps anonymous memory, registers it with this
    client (register_buffer of exactly that range again returns 0, as the
    reference expects after an alloc) and returns its address; 0 when it
    cannot (before setup, size 0, mmap failure). The memory lives until the
    process exits, as the reference's shared regions do.
"""
import ctypes
import logging
import mmap
import os
import threading

from .errors import ErrorCode
from .setup_args import env_int, host_name
from .standalone_wire import check_config, parse_server_address, request

log = logging.getLogger("mooncake_cxl")

RPC_FAIL = int(ErrorCode.RPC_FAIL)
INVALID = int(ErrorCode.INVALID_PARAMS)

_REGIONS_LOCK = threading.Lock()
_REGIONS = []  # (mmap, address, size): alloc_from_mem_pool memory, kept until the process exits


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
        timeout_s = env_int("MC_CXL_CONNECT_TIMEOUT_MS", 3000) / 1000
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
        # TODO(tenants): attach as cfg["tenant_id"] (_setup takes it); until then a dummy is in
        # the default tenant, whatever tenant its standalone client serves.
        rc = self._setup(host_name(cfg["host"]), cfg["protocol"], cfg["master_server_addr"],
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
