"""Tenants: setup(..., tenant_id=T) gives a client its own
key namespace on a shared pool. Two tenants run in separate processes on one
pool and master; the same key holds each tenant's own value; no call of one
(get, get_into, batch forms, zero-copy, is_exist, remove, batch_remove,
remove_by_regex, remove_all) sees or touches the other's keys; /get_all_keys,
/query_key and /metrics show the data per tenant; the default tenant
("default", Mooncake's) stores keys unchanged. (Mooncake 0.3.13's master
isolates tenants only with --enable_multi_tenants; ours always does.)"""
import json
import urllib.error
import urllib.request

import pytest

from conftest import connect, MooncakeDistributedStore
from tenant_workers import tenant_client

OK, INVALID, NOT_FOUND = 0, -600, -704


def _http(master, path):
    try:
        with urllib.request.urlopen(master.metrics_url + path, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _call(child, *cmd):
    child.conn.send(cmd)
    return child.recv()


def _start(children, master, tenant):
    c = children(tenant_client, master.address, tenant)
    assert c.recv() == ("ready", 0)
    return c


def _metric(text, name, tenant):
    for line in text.splitlines():
        if line.startswith(f'{name}{{tenant="{tenant}"}}'):
            return float(line.split()[-1])
    return None


@pytest.fixture
def two(master, children):
    a, b = _start(children, master, "alpha"), _start(children, master, "beta")
    yield a, b
    for c in (a, b):
        _call(c, "stop")


def test_same_key_own_value_in_each_tenant(master, two):
    a, b = two
    assert _call(a, "put", "k", b"alpha-value") == OK
    assert _call(b, "put", "k", b"beta") == OK
    assert _call(a, "get", "k") == b"alpha-value" and _call(b, "get", "k") == b"beta"
    assert _call(a, "get_size", "k") == 11 and _call(b, "get_size", "k") == 4
    assert _call(a, "get_into", "k", 64) == (11, b"alpha-value")
    assert _call(b, "get_buffer", "k") == b"beta"
    assert _call(a, "put_from", "z", b"zero-copy") == OK
    assert _call(b, "get_into", "z", 64)[0] == NOT_FOUND
    assert _call(b, "get_buffer", "z") is None
    got, values = _call(a, "batch_get_into", ["k", "z"], 64)
    assert got == [11, 9] and values == [b"alpha-value", b"zero-copy"]
    assert _call(b, "batch_is_exist", ["k", "z"]) == [1, 0]
    assert _call(b, "get_batch", ["k", "z"]) == [b"beta", b""]
    # upsert in one tenant leaves the other's value
    assert _call(b, "upsert", "k", b"beta-2") == OK
    assert _call(a, "get", "k") == b"alpha-value" and _call(b, "get", "k") == b"beta-2"
    # a default-tenant client (this process) sees neither
    s = connect(master)
    try:
        assert s.is_exist("k") == 0 and s.get("z") == b""
        assert s.put("k", b"default") == OK
        assert _call(a, "get", "k") == b"alpha-value" and s.get("k") == b"default"
    finally:
        s.close()


def test_is_exist_false_across_tenants(master, two):
    a, b = two
    assert _call(a, "put", "only-a", b"x") == OK
    assert _call(a, "is_exist", "only-a") == 1
    assert _call(b, "is_exist", "only-a") == 0
    assert _call(b, "get", "only-a") == b""


def test_removes_of_one_tenant_leave_the_other(master, two):
    a, b = two
    for c in (a, b):
        for k in ("k1", "k2", "keep", "other"):
            assert _call(c, "put", k, c is a and b"A" or b"B") == OK
    assert _call(a, "remove", "k1", True) == OK
    assert _call(b, "get", "k1") == b"B"
    assert _call(a, "remove", "k1", True) == NOT_FOUND  # its own is gone; B's is not its key
    assert _call(a, "batch_remove", ["k2", "nope"], True) == [OK, NOT_FOUND]
    assert _call(b, "get", "k2") == b"B"
    # the pattern sees the tenant's key as the tenant wrote it (no prefix)
    assert _call(b, "remove_by_regex", r"^k\d$", True) == 2
    assert _call(b, "get", "k1") == b"" and _call(b, "get", "keep") == b"B"
    assert _call(a, "get", "keep") == b"A"
    assert _call(b, "get", "other") == b"B"
    assert _call(a, "remove_all", True) == 2  # keep and other of alpha
    assert _call(b, "get", "other") == b"B" and _call(a, "get", "other") == b""
    assert _call(b, "remove_all", True) == 2  # keep and other of beta


def test_listing_and_metrics_per_tenant(master, two):
    a, b = two
    assert _call(a, "put", "shared", b"1234") == OK and _call(a, "put", "a-only", b"12") == OK
    assert _call(b, "put", "shared", b"123456") == OK
    s = connect(master)
    try:
        assert s.put("plain", b"xyz") == OK
        status, body = _http(master, "/get_all_keys")  # the default tenant's, as Mooncake lists
        assert status == 200 and set(body.split()) == {"plain"}
        status, body = _http(master, "/get_all_keys?tenant=alpha")
        assert status == 200 and set(body.split()) == {"shared", "a-only"}
        status, body = _http(master, "/get_all_keys?tenant=*")
        rows = {tuple(line.split("\t")) for line in body.splitlines() if line}
        assert rows == {("default", "plain"), ("alpha", "shared"), ("alpha", "a-only"), ("beta", "shared")}
        status, body = _http(master, "/query_key?key=shared&tenant=beta")
        assert status == 200 and json.loads(body)["data"][0]["size_"] == 6
        assert _http(master, "/query_key?key=shared")[0] == 404  # not a default-tenant key
        assert _http(master, "/query_key?key=plain")[0] == 200
        assert _http(master, "/get_all_keys?tenant=a%0Ab")[0] == 400
        status, text = _http(master, "/metrics")
        assert _metric(text, "master_tenant_key_count", "alpha") == 2
        assert _metric(text, "master_tenant_key_count", "beta") == 1
        assert _metric(text, "master_tenant_key_count", "default") == 1
        assert _metric(text, "master_tenant_value_bytes", "alpha") == 6
        assert _metric(text, "master_tenant_value_bytes", "beta") == 6
    finally:
        s.close()


def test_metrics_name_at_most_64_tenants(master):
    s = MooncakeDistributedStore()
    for i in range(70):
        assert s.setup("127.0.0.1:0", "P", 0, 0, "cxl", "", master.address, tenant_id=f"t{i}") == OK
        assert s.put("k", b"v") == OK
        assert s.close() == OK
    text = _http(master, "/metrics")[1]
    named = [l for l in text.splitlines() if l.startswith("master_tenant_key_count{")]
    assert len(named) == 65  # 64 tenants by name + "_other"
    assert _metric(text, "master_tenant_key_count", "_other") == 6


def test_default_tenant_unchanged_and_bad_ids(master):
    # tenant_id "default" (the parameter's default) and "" are the same
    # namespace as a client that never names one; keys are stored unchanged.
    s1 = connect(master)
    s2 = MooncakeDistributedStore()
    s3 = MooncakeDistributedStore()
    try:
        assert s2.setup("127.0.0.1:0", "P", 0, 0, "cxl", "", master.address, tenant_id="default") == OK
        assert s3.setup({"local_hostname": "127.0.0.1:0", "metadata_server": "P",
                         "master_server_addr": master.address, "protocol": "cxl", "tenant_id": ""}) == OK
        assert s1.put("d", b"v") == OK
        assert s2.get("d") == b"v" and s3.get("d") == b"v"
        assert _http(master, "/get_all_keys")[1].split() == ["d"]
        # a default-tenant key may not reach into another tenant's namespace
        assert s1.put("\x1dalpha\x1dk", b"v") == INVALID
        assert s1.is_exist("\x1dalpha\x1dk") == INVALID
        bad = MooncakeDistributedStore()
        assert bad.setup("127.0.0.1:0", "P", 0, 0, "cxl", "", master.address, tenant_id="a\nb") == INVALID
        assert bad.setup("127.0.0.1:0", "P", 0, 0, "cxl", "", master.address, tenant_id="x" * 129) == INVALID
        assert bad.health_check() == 1
        assert s1.get("d") == b"v"  # the store stays usable
    finally:
        for s in (s1, s2, s3):
            s.close()


def test_tenant_key_length_limit(master):
    # The prefix counts against the pool's key length limit.
    limit = 65535  # layout.h kMaxKeyLength
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1:0", "P", 0, 0, "cxl", "", master.address, tenant_id="tenant7") == OK
    try:
        room = limit - len("tenant7") - 2
        assert s.put("k" * room, b"v") == OK and s.get("k" * room) == b"v"
        assert s.put("k" * (room + 1), b"v") == INVALID
    finally:
        s.close()


def test_tensors_per_tenant(master):
    torch = pytest.importorskip("torch")
    a, b = MooncakeDistributedStore(), MooncakeDistributedStore()
    try:
        for s, t in ((a, "alpha"), (b, "beta")):
            assert s.setup("127.0.0.1:0", "P", 0, 0, "cxl", "", master.address, tenant_id=t) == OK
        ta, tb = torch.arange(8, dtype=torch.float32), torch.ones(3, dtype=torch.int64)
        assert a.put_tensor("t", ta) == OK and b.put_tensor("t", tb) == OK
        assert torch.equal(a.get_tensor("t"), ta) and torch.equal(b.get_tensor("t"), tb)
        assert a.batch_put_tensor(["only-a"], [ta]) == [OK]
        assert b.batch_get_tensor(["only-a", "t"])[0] is None
        assert torch.equal(a.get_tensor("only-a", view=True), ta)
    finally:
        a.close(), b.close()
