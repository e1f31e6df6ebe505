"""What the announcement channel said, per request key, and whether its
producer still lives: shared by the scheduler half (whether to wait) and
the worker half's asynchronous loader (when to stop waiting)."""
import os
from dataclasses import dataclass

from ..kv import Listener
from ..kv.announce import BLOCKS_READY, REQUEST_ABORTED, REQUEST_DONE


def alive(pid):
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child nobody reaped yet is a zombie: dead for us
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@dataclass
class News:
    end: int = 0
    done: bool = False
    aborted: bool = False
    pid: int = 0


class Watch:
    def __init__(self, store, channel):
        self.listener = Listener(store, channel, from_start=True)
        self.news = {}

    def _absorb(self, anns):
        pid = self.listener.producer_pid
        for a in anns:
            n = self.news.setdefault(a.request, News())
            n.pid = pid or n.pid
            if a.kind == BLOCKS_READY:
                n.end = max(n.end, a.end)
            elif a.kind == REQUEST_DONE:
                n.done, n.end = True, max(n.end, a.end)
            elif a.kind == REQUEST_ABORTED:
                n.aborted = True
        if len(self.news) > 4096:  # old keys: keep the newest half
            for k in list(self.news)[:2048]:
                del self.news[k]

    def poll(self):
        self._absorb(self.listener.poll())

    def wait(self, timeout):
        """Sleeps on the channel's futex until a record or the timeout."""
        self._absorb(self.listener.wait(timeout))

    def get(self, key):
        return self.news.get(key)

    def producer_alive(self, news):
        return alive(self.listener.producer_pid or (news.pid if news else 0))

    def producer_pid(self, news):
        return self.listener.producer_pid or (news.pid if news else 0)
