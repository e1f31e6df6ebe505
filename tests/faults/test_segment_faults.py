"""DRAM segments under faults (docs/architecture.md §10): a killed segment
owner's objects become misses (never other bytes) and the pool lives on; a
master restarted on the pool drops every segment object and keeps the pool's."""
import os
import signal
import sys

from conftest import connect, value_for, wait_until

# The segment workers live beside the placement tests (tests/space); spawned
# children get this sys.path too.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "space"))
import segment_workers  # noqa: E402
from segment_workers import ask  # noqa: E402

OWNER = "127.0.0.1:17002"


def start_owner(children, master):
    return segment_workers.start_owner(children, master, OWNER)


def test_a_killed_segment_owner_gives_misses_and_the_pool_lives_on(master, children):
    owner = start_owner(children, master)
    other = connect(master)
    try:
        seg = [f"dead/{i}" for i in range(20)]
        for k in seg:
            assert ask(owner, "put", k, value_for(k, 100_000), OWNER, False) == 0
            assert ask(owner, "desc", k)[0][0] == "segment"
        assert ask(owner, "put", "dead/pool", value_for("dead/pool", 100_000), "", False) == 0
        assert all(other.is_exist(k) == 1 for k in seg)
        os.kill(owner.proc.pid, signal.SIGKILL)
        owner.proc.join(30)
        # The master finds the process gone and drops its segment's objects.
        wait_until(lambda: all(other.is_exist(k) == 0 for k in seg), "the dead owner's objects to go",
                   master=master)
        assert all(other.get(k) == b"" for k in seg)
        assert other.get_replica_desc(seg[0]) == []
        # The pool is untouched: its object is there, puts and reads work.
        assert other.get("dead/pool") == value_for("dead/pool", 100_000)
        assert other.put("dead/after", b"a" * 50_000) == 0
        assert other.get("dead/after") == b"a" * 50_000
        # The same key can be put again (into the pool now).
        assert other.put(seg[0], b"new") == 0 and other.get(seg[0]) == b"new"
    finally:
        other.close()


def test_a_restarted_master_drops_segment_objects_and_keeps_the_pool(master_factory, children):
    m1 = master_factory()
    owner = start_owner(children, m1)
    try:
        for i in range(10):
            assert ask(owner, "put", f"rs/seg{i}", value_for(f"rs/seg{i}", 50_000), OWNER, False) == 0
            assert ask(owner, "put", f"rs/pool{i}", value_for(f"rs/pool{i}", 50_000), "", False) == 0
        assert ask(owner, "desc", "rs/seg0")[0][0] == "segment"
        m1.kill()
        m2 = master_factory(format=False, extra_flags=[f"--rpc_port={m1.port}"])
        reader = connect(m2)
        try:
            for i in range(10):
                assert reader.is_exist(f"rs/seg{i}") == 0, i
                assert reader.get(f"rs/pool{i}") == value_for(f"rs/pool{i}", 50_000), i
            # The owner too: its segment objects are misses; it re-attaches and
            # places new ones in its segment again.
            assert ask(owner, "get", "rs/seg0") == b""
            wait_until(lambda: ask(owner, "put", "rs/again", b"g" * 9000, OWNER, False) == 0,
                       "the owner's put after the restart", master=m2)
            assert ask(owner, "desc", "rs/again")[0][0] == "segment"
            assert ask(owner, "get", "rs/again") == b"g" * 9000
        finally:
            reader.close()
    finally:
        owner.conn.send(("exit",))
        owner.result()
