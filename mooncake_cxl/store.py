"""The drop-in façade: mooncake_cxl.MooncakeDistributedStore.

The byte calls (put, get, is_exist, get_into, ...) are the C++ binding itself
(mooncake_cxl._core), so a get or is_exist goes straight from Python into C++
with no Python frame in between. Here in Python: setup() (its two call forms,
seven positional arguments plus keywords or one dict with size strings, are
easier to keep identical to Mooncake's in Python), the tensor family
(tensor.py), replica descriptors (replica.py), put/get sessions (session.py),
the dummy client (dummy.py), and the methods of Mooncake's store that mean
nothing on a CXL pool (segments, tasks, ...), which return NOT_SUPPORTED
(-1012) in the reference's return shape with one log line saying what to use
instead.
"""
import logging
import os

from . import _core
from .dummy import DummyMethods
from .errors import ErrorCode
from .remote.client import secret_from_env
from .remote.mode import remote_mode
from .remote.store import RemoteStoreMethods
from .replica import ReplicaMethods
from .segment_te import segment_engine
from .session import SessionMethods
from .setup_args import (PROTOCOLS, config_flag, env_int, normalize_config, strict_buffers_wanted,
                         tier_path, valid_tenant, with_port)
from .sizes import parse_size
from .tensor import TensorMethods

log = logging.getLogger("mooncake_cxl")

_REQUIRED = ("local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
             "protocol", "rdma_devices", "master_server_addr")

_NOT_SUPPORTED = int(ErrorCode.NOT_SUPPORTED)


def _code_name(rc):
    try:
        return ErrorCode(rc).name
    except ValueError:
        return "error"


def _unsupported(op, why):
    log.warning("%s() is not supported: %s", op, why)
    return _NOT_SUPPORTED


_SEGMENTS = ("a CXL pool is one shared segment that the master formats and clients map; "
             "use the master's --cxl_size to size it")
_TASKS = ("a CXL pool holds one copy that every host reads directly, so there is nothing to copy "
          "or move; use get()/get_into() from any host")


class MooncakeDistributedStore(TensorMethods, ReplicaMethods, SessionMethods, DummyMethods,
                               _core.StoreCore):
    """A client of a mooncake_cxl pool, with the API of Mooncake's store."""

    def __init__(self):
        _core.StoreCore.__init__(self)
        self._init_sessions()

    def setup(self, local_hostname, metadata_server=None, global_segment_size=None,
              local_buffer_size=None, protocol=None, rdma_devices=None,
              master_server_addr=None, engine=None, enable_ssd_offload=False,
              ssd_offload_path="", tenant_id="default", enable_client_http_server=False,
              client_http_port=9300, rpc_transport=None, strict_buffers=None):
        """Attach to the master and map the pool. Returns 0 or a negative ErrorCode.

        setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
              protocol, rdma_devices, master_server_addr, ...) or setup(config: dict).
        global_segment_size, local_buffer_size and metadata_server are accepted for
        compatibility: a CXL pool needs no per-client segment or metadata service.
        rpc_transport (ours, optional): "ring" (default: the master's control path
        over shared-memory rings in the pool) or "tcp"; env MC_CXL_RPC likewise.
        strict_buffers (ours, optional): zero-copy calls accept only memory inside
        a registered buffer, as Mooncake's do; default env MC_CXL_STRICT_BUFFERS=1,
        else off (unregistered memory is accepted).
        """
        if isinstance(local_hostname, dict):
            if metadata_server is not None:
                raise TypeError("setup(config: dict) takes no other arguments")
            return self._setup_from_dict(local_hostname)
        given = (local_hostname, metadata_server, global_segment_size, local_buffer_size,
                 protocol, rdma_devices, master_server_addr)
        missing = [n for n, v in zip(_REQUIRED, given) if v is None]
        if missing:
            raise TypeError(f"setup() missing required arguments: {', '.join(missing)}")
        for name, v in (("local_hostname", local_hostname), ("metadata_server", metadata_server),
                        ("protocol", protocol), ("rdma_devices", rdma_devices),
                        ("master_server_addr", master_server_addr)):
            if not isinstance(v, str):
                raise TypeError(f"setup(): {name} must be str, not {type(v).__name__}")
        for name, v in (("global_segment_size", global_segment_size),
                        ("local_buffer_size", local_buffer_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise TypeError(f"setup(): {name} must be a non-negative int, not {v!r}")
        return self._setup(local_hostname, protocol, master_server_addr, rpc_transport,
                           tenant_id=tenant_id, enable_ssd_offload=bool(enable_ssd_offload),
                           ssd_offload_path=ssd_offload_path or "", strict_buffers=strict_buffers,
                           segment_size=global_segment_size)

    def _setup_from_dict(self, config):
        config = normalize_config(config)
        for key in ("local_hostname", "metadata_server", "master_server_addr"):
            if not isinstance(config.get(key), str) or not config.get(key):
                log.error("setup(config): missing required config: %s", key)
                return int(ErrorCode.INVALID_PARAMS)
        for key in ("global_segment_size", "local_buffer_size"):
            if key in config and parse_size(config[key]) is None:
                log.error("setup(config): invalid size value for %s: %r", key, config[key])
                return int(ErrorCode.INVALID_PARAMS)
        return self._setup(config["local_hostname"], str(config.get("protocol", "tcp")),
                           config["master_server_addr"], config.get("rpc_transport"),
                           tenant_id=config.get("tenant_id", "default"),
                           enable_ssd_offload=config_flag(config.get("enable_ssd_offload", False)),
                           ssd_offload_path=str(config.get("ssd_offload_path", "") or ""),
                           strict_buffers=config.get("strict_buffers"),
                           segment_size=parse_size(config.get("global_segment_size", 0)) or 0)

    def _setup(self, local_hostname, protocol, master_server_addr, rpc_transport=None,
               pool_hint=None, tenant_id="default", enable_ssd_offload=False, ssd_offload_path="",
               strict_buffers=None, segment_size=0):
        """pool_hint: (path, size) of the pool on this host, from a standalone
        client (setup_dummy); MC_CXL_DEV_PATH, when set, wins. segment_size:
        global_segment_size, a DRAM segment beside the pool only with
        MC_CXL_DRAM_SEGMENT=1 (docs/architecture.md §10)."""
        transport = (rpc_transport or os.environ.get("MC_CXL_RPC") or "ring").lower()
        if transport not in ("ring", "tcp"):
            log.error("setup(): rpc_transport %r is neither 'ring' nor 'tcp'", transport)
            return int(ErrorCode.INVALID_PARAMS)
        if protocol.lower() not in PROTOCOLS:
            log.error("setup(): unsupported protocol %r (use 'cxl', 'tcp' or 'rdma': "
                      "all of them read and write the CXL pool directly)", protocol)
            return int(ErrorCode.INVALID_PARAMS)
        if tenant_id is None or tenant_id == "":
            tenant_id = "default"  # Mooncake's default tenant
        if not isinstance(tenant_id, str) or not valid_tenant(tenant_id):
            log.error("setup(): tenant_id %r refused: 1..128 bytes of UTF-8 without control "
                      "characters", tenant_id)
            return int(ErrorCode.INVALID_PARAMS)
        if self.health_check() != 1:
            self.close()  # a second setup() replaces the first, as in Mooncake
        local_hostname = with_port(local_hostname)
        cxl = protocol.lower() == "cxl"
        pool_path = os.environ.get("MC_CXL_DEV_PATH", "") if cxl else ""
        pool_size = env_int("MC_CXL_DEV_SIZE", 0) if cxl else 0
        if pool_hint and not pool_path:
            pool_path, pool_size = pool_hint
        remote, why = remote_mode(master_server_addr, pool_path)
        if remote:
            log.info("setup(): remote client over the Transfer Engine: %s", why)
            self.__class__ = RemoteDistributedStore
            rc = self._setup_remote(
                local_hostname, master_server_addr, tenant_id, secret_from_env(),
                protocol.lower(), env_int("MC_CXL_CONNECT_TIMEOUT_MS", 3000),
                env_int("MC_CXL_RPC_TIMEOUT_MS", 10000), env_int("MC_CXL_PUT_WAIT_MS", 2000))
            if rc != 0:
                log.error("setup(): could not attach to the master at %r: %s (%d)",
                          master_server_addr, _code_name(rc), rc)
            return rc
        if type(self) is RemoteDistributedStore:
            self.__class__ = MooncakeDistributedStore
        rc = self._setup_core(
            local_hostname, master_server_addr, pool_path, pool_size,
            env_int("MC_CXL_CONNECT_TIMEOUT_MS", 3000),
            env_int("MC_CXL_RPC_TIMEOUT_MS", 10000),
            env_int("MC_CXL_PUT_WAIT_MS", 2000), transport == "ring", tenant_id,
            # The SSD tier's directory as this host sees it (the reference's
            # variable); default: the master's --root_fs_dir.
            tier_path(ssd_offload_path or os.environ.get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "")),
            enable_ssd_offload, strict_buffers_wanted(strict_buffers),
            segment_size if os.environ.get("MC_CXL_DRAM_SEGMENT") == "1" else 0,
            segment_engine(local_hostname))
        if rc != 0:
            # Callers such as LMCache ignore the code: this line is their trace.
            log.error("setup(): could not attach to the master at %r: %s (%d)", master_server_addr,
                      _code_name(rc), rc)
        return rc

    # ---- segments: the pool is the one segment ----

    def mount_segment(self, path, size, offset=0, protocol="tcp", location=""):
        return {"ret": _unsupported("mount_segment", _SEGMENTS), "segment_ids": []}

    def allocate_and_mount_segment(self, size, protocol="tcp", location=""):
        return {"ret": _unsupported("allocate_and_mount_segment", _SEGMENTS), "segment_ids": [],
                "allocated_size": 0}

    def unmount_segment(self, segment_ids, grace_period_seconds=0):
        return _unsupported("unmount_segment", _SEGMENTS)

    def unmount_and_free_segment(self, segment_ids, grace_period_seconds=0):
        return _unsupported("unmount_and_free_segment", _SEGMENTS)

    def unmount_local_disk_segment(self, grace_period_seconds=0):
        return _unsupported("unmount_local_disk_segment",
                            "this store has no local-disk tier; use remove() to free objects")

    # ---- replica tasks ----

    def create_copy_task(self, key, targets):
        return ((0, 0), _unsupported("create_copy_task", _TASKS))

    def create_move_task(self, key, source, target):
        return ((0, 0), _unsupported("create_move_task", _TASKS))

    def query_task(self, task_id):
        return (None, _unsupported("query_task", "no task is ever created: " + _TASKS))

    def get_offload_rpc_read_count(self):
        """Reads this client served from the SSD tier (records read from
        --root_fs_dir); reads from the pool, promoted objects included, do not count."""
        return int(self._offload_read_count())


class RemoteDistributedStore(RemoteStoreMethods, MooncakeDistributedStore):
    """What a MooncakeDistributedStore becomes at setup() on a host that cannot
    map the pool (remote/): the same API over the Transfer Engine."""
