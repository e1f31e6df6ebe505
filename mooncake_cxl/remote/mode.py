"""Whether a store set up on this host is local (maps the pool) or remote
(over the Transfer Engine): MC_CXL_REMOTE=1 forces remote, =0 local; else,
when this host was given the remote secret (MC_CXL_AUTH_TOKEN_FILE), it is
remote when the pool the master names (or MC_CXL_DEV_PATH) cannot be opened
for reading and writing here. Without the secret a local setup reports why
the pool does not open, as before. The choice is logged once per setup."""
import logging
import os
import socket

from . import wire

log = logging.getLogger("mooncake_cxl")


def _ping(master_addr, timeout=3.0):
    host, _, port = master_addr.rpartition(":")
    with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout) as s:
        s.sendall(wire.frame(wire.PING, 1, b""))
        body = wire.recv_reply(s)
    return wire.ping_reply(body)


def remote_mode(master_addr, pool_path=""):
    """(True, why) for a remote client, (False, why) for a local one."""
    forced = os.environ.get("MC_CXL_REMOTE", "")
    if forced not in ("", "0"):
        return True, "MC_CXL_REMOTE=1"
    if forced == "0":
        return False, "MC_CXL_REMOTE=0"
    if not os.environ.get("MC_CXL_AUTH_TOKEN_FILE"):
        return False, "no MC_CXL_AUTH_TOKEN_FILE"
    path = pool_path
    if not path:
        try:
            path = _ping(master_addr)["pool_path"]
        except (OSError, ValueError, wire.WireError):
            return False, "the master did not answer a ping"  # the local setup reports it
    try:
        os.close(os.open(path, os.O_RDWR))
        return False, f"the pool {path} opens here"
    except OSError as e:
        return True, f"the pool {path} cannot be opened here ({e.strerror})"
