"""The Transfer Engine of a client's DRAM segment (docs/architecture.md §10):
the binding calls `serve` once the segment is mapped (its session goes into
every Attach) and `read` when this client reads a value in another client's
segment. One engine per store, started on first use: a client that never
serves a segment and never reads another's starts none. `MC_CXL_SEGMENT_TE=0`
turns it off (the segment is then read by its owner only)."""
import logging
import os
import threading

log = logging.getLogger("mooncake_cxl")


def segment_engine(local_hostname):
    """The engine object the binding takes, or None when switched off."""
    if os.environ.get("MC_CXL_SEGMENT_TE", "1") == "0":
        return None
    return SegmentEngine(local_hostname)


class SegmentEngine:
    def __init__(self, local_hostname):
        # The session's host part: where other hosts of the pod reach this one.
        self.host = os.environ.get("MC_CXL_TE_HOST") or local_hostname.rpartition(":")[0] or "127.0.0.1"
        self.protocol = os.environ.get("MC_CXL_SEGMENT_TE_PROTOCOL", "tcp")
        self.te = None
        self.failed = False  # the engine could not start: not tried again
        self.bases = {}      # session -> the owner's segment address (its first registered buffer)
        self.lock = threading.Lock()

    def _engine(self):
        with self.lock:
            if self.te is None and not self.failed:
                try:
                    from .remote.engine import transfer_engine_class
                    te = transfer_engine_class()()
                    if te.initialize(self.host, "P2PHANDSHAKE", self.protocol, "") != 0:
                        raise RuntimeError(f"initialize({self.host}, {self.protocol}) failed")
                    self.te = te
                except Exception as e:  # ImportError, a missing system library, a refused start
                    self.failed = True
                    log.warning("DRAM segment: no Transfer Engine (%s): this client's segment is read by "
                                "its owner only, other clients' segments are misses here", e)
            return self.te

    def serve(self, base, size):
        """Registers [base, base + size) and returns the session ("" = not served)."""
        te = self._engine()
        if te is None:
            return ""
        if te.register_memory(base, size) != 0:
            log.warning("DRAM segment: registering %d bytes with the Transfer Engine failed: "
                        "read by its owner only", size)
            return ""
        return f"{self.host}:{te.get_rpc_port()}"

    def _base(self, te, session):
        base = self.bases.get(session)
        if base is None:
            base = te.get_first_buffer_address(session)
            if base:
                with self.lock:
                    if len(self.bases) >= 1024:
                        self.bases.clear()
                    self.bases[session] = base
        return base

    def read(self, session, offset, dst, n):
        """Copies n bytes at `offset` of the segment served at `session` to dst."""
        te = self._engine()
        base = te and self._base(te, session)
        return bool(base) and te.transfer_sync_read(session, dst, base + offset, n) == 0
