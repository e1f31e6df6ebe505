"""The whole drop-in: every public method of Mooncake
0.3.13's MooncakeDistributedStore exists on ours with the reference's
parameters and defaults, every one is in the decision table of docs/api.md, and the
ones that mean nothing on a CXL pool return NOT_SUPPORTED (-1012) in the
reference's return shape with one log line saying what to use instead.

The reference half needs only `import mooncake.store` (no client, no
network), so it runs wherever the wheel is installed.
"""
import inspect
import logging
import os
import re

import pytest

import oracle
from conftest import REPO
from mooncake_cxl import MooncakeDistributedStore

NOT_SUPPORTED = -1012
README = os.path.join(REPO, "README.md")
API_DOC = os.path.join(REPO, "docs", "api.md")  # the per-method decision table
_REF_SKIP = None if oracle.reference_importable() else oracle.reference_skip_reason()
needs_reference = pytest.mark.skipif(_REF_SKIP is not None, reason=str(_REF_SKIP))


def public(cls):
    return sorted(n for n in dir(cls) if not n.startswith("_"))


def reference_class():
    return oracle.reference_module().MooncakeDistributedStore


def _split_top(s):
    """Splits a parameter list at commas outside brackets and <...> reprs."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "[(<{":
            depth += 1
        elif ch in "])>}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _norm_default(text):
    text = text.strip()
    if "ReplicateConfig object" in text:
        return "ReplicateConfig()"
    return text


def doc_params(func, name):
    """[(name, default or None)] from a pybind11 signature line `name(self: T, a: T = d, ...) -> R`."""
    first = (func.__doc__ or "").strip().splitlines()[0]
    m = re.match(rf"{name}\((.*)\)\s*->", first)
    assert m, f"no signature line in {name}'s docstring: {first!r}"
    params = []
    for p in _split_top(m.group(1))[1:]:  # drop self
        if p.startswith("*"):
            params.append((p.split(":")[0], None))
            continue
        head, _, default = p.partition("=")
        params.append((head.split(":")[0].strip(), _norm_default(default) if default else None))
    return params


def our_params(cls, name):
    """[(name, default or None, kind)] of our method, Python or pybind11."""
    func = getattr(cls, name)
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return [(n, d, "positional") for n, d in doc_params(func, name)]
    out = []
    for p in list(sig.parameters.values())[1:]:
        if p.kind is p.VAR_POSITIONAL:
            out.append(("*" + p.name, None, "var"))
            continue
        d = None if p.default is p.empty else repr(p.default)
        out.append((p.name, d, "keyword" if p.kind is p.KEYWORD_ONLY else "positional"))
    return out


def _same_default(ref, ours, name):
    if ref == "ReplicateConfig()":
        return ours in ("None", "ReplicateConfig()") or (ours or "").startswith("<mooncake_cxl")
    return ref == ours or (ref in ("''", '""') and ours in ("''", '""'))


@needs_reference
def test_every_reference_method_exists():
    """The issue's first check: dir() parity (every public name of the reference exists on ours)."""
    missing = sorted(set(public(reference_class())) - set(public(MooncakeDistributedStore)))
    assert missing == []
    assert len(public(reference_class())) == 97


@needs_reference
def test_signatures_match_the_reference():
    """Same positional parameters (names unless the reference has none: argN), and
    every reference default is ours too. Ours may add keyword-only options."""
    ref = reference_class()
    problems = []
    for name in public(ref):
        if name == "setup":  # overloaded there; covered by test_conformance's setup group
            continue
        rp = doc_params(getattr(ref, name), name)
        op = [p for p in our_params(MooncakeDistributedStore, name) if p[2] != "keyword"]
        if len(op) < len(rp):
            problems.append(f"{name}: {len(op)} parameters, the reference has {len(rp)}")
            continue
        for (rn, rd), (on, od, _) in zip(rp, op):
            if not re.fullmatch(r"arg\d+", rn) and rn.lstrip("*") != on.lstrip("*"):
                problems.append(f"{name}: parameter {on!r}, the reference's is {rn!r}")
            if rd is not None and not _same_default(rd, od, name):
                problems.append(f"{name}({rn}): default {od}, the reference's is {rd}")
        for on, od, _ in op[len(rp):]:
            if od is None:
                problems.append(f"{name}: extra required parameter {on!r}")
    assert problems == []


def readme_table():
    """{method: (decision, why)} from the per-method decision table in docs/api.md."""
    rows = {}
    for line in open(API_DOC, encoding="utf-8"):
        m = re.match(r"\| `(\w+)` \| (works|differs on purpose|not supported) \| (.+) \|$", line.strip())
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def test_readme_table_lists_every_method():
    rows = readme_table()
    assert sorted(rows) == public(MooncakeDistributedStore)
    assert all(why.strip() for _, why in rows.values())
    counts = {d: sum(1 for v in rows.values() if v[0] == d) for d in ("works", "differs on purpose",
                                                                      "not supported")}
    said = (f"{counts['works']} work, {counts['differs on purpose']} differ on purpose, "
            f"{counts['not supported']} are not supported")
    for doc in (README, API_DOC):
        assert said in open(doc, encoding="utf-8").read().replace("\n", " "), doc


@needs_reference
def test_readme_table_covers_the_reference():
    assert set(public(reference_class())) <= set(readme_table())


# The not-supported methods: a call, and the reference's return shape carrying -1012.
NOT_SUPPORTED_CALLS = {
    "mount_segment": (("/dev/shm/x", 1 << 20), {"ret": NOT_SUPPORTED, "segment_ids": []}),
    "allocate_and_mount_segment": ((1 << 20,), {"ret": NOT_SUPPORTED, "segment_ids": [], "allocated_size": 0}),
    "unmount_segment": ((["seg"],), NOT_SUPPORTED),
    "unmount_and_free_segment": ((["seg"], 0), NOT_SUPPORTED),
    "unmount_local_disk_segment": ((), NOT_SUPPORTED),
    "create_copy_task": (("k", ["seg"]), ((0, 0), NOT_SUPPORTED)),
    "create_move_task": (("k", "a", "b"), ((0, 0), NOT_SUPPORTED)),
    "query_task": (((1, 2),), (None, NOT_SUPPORTED)),
    "get_tensor_into_cuda": (("k", None), NOT_SUPPORTED),
    "batch_get_tensor_into_cuda": ((["k", "l"], [None, None]), [NOT_SUPPORTED, NOT_SUPPORTED]),
}


def test_not_supported_shapes_and_one_log_line(master, caplog):
    rows = readme_table()
    assert sorted(NOT_SUPPORTED_CALLS) == sorted(n for n, (d, _) in rows.items() if d == "not supported")
    from conftest import connect
    s = connect(master)
    try:
        for name, (args, want) in NOT_SUPPORTED_CALLS.items():
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="mooncake_cxl"):
                got = getattr(s, name)(*args)
            assert got == want, name
            lines = [r for r in caplog.records if r.name == "mooncake_cxl"]
            assert len(lines) == 1, (name, [r.getMessage() for r in lines])
            msg = lines[0].getMessage()
            assert "not supported" in msg and "use " in msg, msg  # why, and what to use instead
        assert s.health_check() == 0  # still usable
        assert s.put("after", b"x") == 0 and s.get("after") == b"x"
        assert s.get_offload_rpc_read_count() == 0
    finally:
        s.close()
