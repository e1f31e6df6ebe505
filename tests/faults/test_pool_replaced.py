"""The device behind the master's --cxl_path replaced while it runs
(Mooncake's CXL test creates its pool file, ftruncates it, and deletes it in
each test class's teardown while the master keeps running, so the next class
finds a fresh blank file at the same path). The master notices a new
inode at the path (at Ping, Attach and in Tick), logs it loudly, formats a
new blank device with a new uuid and token, and serves it; clients of the old
pool get ILLEGAL_CLIENT (-601) on their next master call. A device holding a
superblock is never formatted; a blank file others may read is formatted
only with --allow_world_readable_pool (the rule of a first format); a file
not yet ftruncated is waited for. A shrink of the *same* file stays a lost
pool (security/test_pool_corruption.py)."""
import os

from conftest import POOL_SIZE, MooncakeDistributedStore, connect, metric, wait_until
from pool_replace_workers import old_client

OK, INVALID, ILLEGAL_CLIENT = 0, -600, -601


def _blank(path, mode=0o600, size=POOL_SIZE):
    """As Mooncake's test: open(O_CREAT), ftruncate (mode set exactly, whatever the umask)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
    os.fchmod(fd, mode)
    if size:
        os.ftruncate(fd, size)
    return fd


def _replaced_total(master):
    return metric(master, "mooncake_cxl_pool_replaced_total")


def _setup(master):
    s = MooncakeDistributedStore()
    return s, s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", master.address)


def test_deleted_and_recreated_pool_file_is_formatted_and_served(master, pool_path, children):
    old = children(old_client, master.address)
    assert old.recv() == ("put", OK)
    os.unlink(pool_path)  # the test class's teardown ...
    fd = _blank(pool_path)  # ... and the next class's setUpClass
    try:
        s, rc = _setup(master)  # its first setup finds the new blank device
        assert rc == OK, master.log_tail()
        assert s.get("old-key") == b""  # a new pool: the old objects are gone
        assert s.put("k", b"new") == OK and s.get("k") == b"new"
        assert _replaced_total(master) == 1
        old.conn.send("replaced")
        assert old.recv() == ("after", ILLEGAL_CLIENT, ILLEGAL_CLIENT)  # a clear refusal, not a hang
        assert old.result() == "done"
        log = master.log_tail()
        assert "POOL DEVICE REPLACED" in log and "whose device was replaced" in log
        # and again: a second replacement works the same way
        s.close()
        os.close(fd)
        os.unlink(pool_path)
        fd = _blank(pool_path)
        s, rc = _setup(master)
        assert rc == OK and s.get("k") == b"" and s.put("k", b"third") == OK
        assert _replaced_total(master) == 2
        s.close()
    finally:
        os.close(fd)


def test_replacement_holding_another_pool_is_not_formatted(master_factory, pool_path, tmp_path):
    m = master_factory()
    keep = connect(m)
    assert keep.put("k", b"v") == OK
    other_path = pool_path + ".other"
    other = master_factory(path=other_path)  # formats a pool of its own there
    other.stop()
    try:
        os.unlink(pool_path)
        os.rename(other_path, pool_path)
        s, rc = _setup(m)
        assert rc == INVALID  # the path now names a pool the master does not serve
        assert "another pool's superblock" in m.log_tail()
        assert keep.put("k2", b"v") == OK and keep.get("k") == b"v"  # the old pool still served
        assert _replaced_total(m) == 0
    finally:
        keep.close()
        if os.path.exists(other_path):
            os.unlink(other_path)


def test_world_readable_replacement_needs_the_flag(master_factory, pool_path):
    m = master_factory()
    os.unlink(pool_path)
    fd = _blank(pool_path, mode=0o644)
    try:
        s, rc = _setup(m)
        assert rc == INVALID and "--allow_world_readable_pool" in m.log_tail()
        os.fchmod(fd, 0o600)  # the operator's fix: the next check formats it
        s, rc = _setup(m)
        assert rc == OK and s.put("k", b"v") == OK
        s.close()
    finally:
        os.close(fd)
    m.stop()
    m2 = master_factory(extra_flags=["--allow_world_readable_pool=true"])
    os.unlink(pool_path)
    fd = _blank(pool_path, mode=0o644)
    try:
        s, rc = _setup(m2)
        assert rc == OK and s.put("k", b"v") == OK
        s.close()
    finally:
        os.close(fd)


def test_unsized_replacement_is_waited_for(master, pool_path):
    os.unlink(pool_path)
    fd = _blank(pool_path, size=0)  # created, not yet ftruncated
    try:
        s, rc = _setup(master)
        assert rc != OK
        assert "waiting for it to hold" in master.log_tail()
        os.ftruncate(fd, POOL_SIZE)
        s, rc = _setup(master)
        assert rc == OK and s.put("k", b"v") == OK and s.get("k") == b"v"
        s.close()
    finally:
        os.close(fd)


def test_replacement_is_noticed_by_tick_too(master, pool_path):
    # No client call at all: the master's Tick formats the new device.
    os.unlink(pool_path)
    fd = _blank(pool_path)
    try:
        # Tick checks every 0.5 s.
        assert wait_until(lambda: _replaced_total(master), "the master to notice the new device",
                          master=master) == 1
    finally:
        os.close(fd)
