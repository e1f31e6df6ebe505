"""What a client's setup takes, shared by the store (store.py), the dummy
client (dummy.py) and the standalone client (standalone.py): the protocols
it accepts, the host:port name a client goes by, the tenant-id rule,
integer settings read from the environment, the keys of setup(config: dict)
with the aliases integrations send, and whether an ssd_offload_path is the
SSD tier's directory.
"""
import difflib
import logging
import os
import random
import socket

log = logging.getLogger("mooncake_cxl")

# Every one of them reads and writes the CXL pool directly; "" is Mooncake's default.
PROTOCOLS = ("tcp", "rdma", "cxl", "")

# Mooncake picks the port of a hostname given without one from this range
# (its transfer engine's handshake ports: 12300 + rand() % 2000).
_PORT_LOW, _PORT_SPAN = 12300, 2000


def with_port(hostname):
    """host:port, as Mooncake reports it: a hostname given without a port gets
    a port number of Mooncake's range (12300-14299) that is free on 127.0.0.1
    a moment ago, so that clients of one host stay distinguishable. Nothing
    listens on it here: the name is an identity only."""
    if hostname.rsplit(":", 1)[-1].isdigit() and ":" in hostname:
        return hostname
    for port in random.sample(range(_PORT_LOW, _PORT_LOW + _PORT_SPAN), 64):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return f"{hostname}:{port}"
    return f"{hostname}:{random.randrange(_PORT_LOW, _PORT_LOW + _PORT_SPAN)}"  # all busy: still a name


def host_name(host):
    """The host part of this host's clients' names: `host`, or the machine's
    name when it is a wildcard (the reference's default is 0.0.0.0)."""
    return socket.gethostname() if host in ("", "0.0.0.0", "::") else host


def valid_tenant(tenant_id):
    """As tenant.h ValidTenantId: 1..128 bytes, no control character."""
    raw = tenant_id.encode("utf-8", "surrogatepass")
    return 0 < len(raw) <= 128 and not any(b < 0x20 or b == 0x7F for b in raw)


def strict_buffers_wanted(option=None):
    """setup()'s strict_buffers when given (True/False, or "1"/"0" in a dict
    config), else MC_CXL_STRICT_BUFFERS: only registered memory for zero-copy."""
    if option is None:
        option = os.environ.get("MC_CXL_STRICT_BUFFERS", "")
    if isinstance(option, str):
        return option.strip().lower() not in ("", "0", "false", "no", "off")
    return bool(option)


def env_int(name, default):
    """The non-negative integer in environment variable `name`, else `default`."""
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


# setup(config: dict): the keys Mooncake's reads, ours (rpc_transport,
# strict_buffers), and the names integrations send for them (LMCache's
# master_server_address, the device_name of SGLang's and LMCache's configs).
CONFIG_KEYS = ("local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
               "protocol", "rdma_devices", "master_server_addr", "tenant_id", "enable_ssd_offload",
               "ssd_offload_path", "enable_client_http_server", "client_http_port",
               "ipc_socket_path", "rpc_transport", "strict_buffers")
CONFIG_ALIASES = {"master_server_address": "master_server_addr", "device_name": "rdma_devices"}


def normalize_config(config):
    """A copy of a setup dict with aliases renamed to Mooncake's keys; each
    unknown key is logged by name (with the key it most resembles) and dropped."""
    out = {}
    for key, value in config.items():
        name = CONFIG_ALIASES.get(key, key)
        if name not in CONFIG_KEYS:
            near = difflib.get_close_matches(str(key), CONFIG_KEYS + tuple(CONFIG_ALIASES), n=1)
            log.warning("setup(config): unknown key %r ignored%s", key,
                        f" (did you mean {near[0]!r}?)" if near else
                        f" (known keys: {', '.join(CONFIG_KEYS)})")
            continue
        if name != key and name in config:
            continue  # Mooncake's own key wins over its alias
        out[name] = value
    return out


def config_flag(value):
    """A setup dict's boolean: True/False, 1/0, or the strings LMCache sends ("True", "false", "1")."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def tier_path(path):
    """`path` when it can be this host's view of the SSD tier directory, else
    "" (the master's --root_fs_dir). A directory without the tier's *.mcxl
    files (SGLang hands each rank a private ssd_offload_path subdirectory) is
    not the tier: it is logged and ignored, since the tier is the master's."""
    if not path or not os.path.isdir(path):
        return path
    try:
        if any(name.endswith(".mcxl") for name in os.listdir(path)):
            return path
    except OSError:
        return path
    log.warning(
        "setup(): ssd_offload_path %r holds no SSD tier files; ignored (this store's SSD tier is "
        "the master's --root_fs_dir, read from where the master says)", path)
    return ""
