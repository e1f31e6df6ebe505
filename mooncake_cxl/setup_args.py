"""What a client's setup takes, shared by the store (store.py), the dummy
client (dummy.py) and the standalone client (standalone.py): the protocols
it accepts, the host:port name a client goes by, the tenant-id rule, and
integer settings read from the environment.
"""
import os
import random
import socket

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
