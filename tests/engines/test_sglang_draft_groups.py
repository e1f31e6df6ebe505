"""SGLang 0.5.23's HiCache v2 API (a draft pool beside the target KV pool)
with Mooncake's group semantics (enable_group_semantics: a page's K, V, draft
K and draft V put with one ReplicateConfig.group_ids entry), through SGLang's
own MooncakeStore: byte-exact on our store, a second process reading what the
first wrote, and the same writer on Mooncake 0.3.13 as the oracle. Under
eviction a page's objects go together, and a read of its target K/V protects
its draft objects too (Mooncake grants a read's lease to every member of the
key's group; here a leased member keeps its whole group)."""
import json
import os

from engines_common import reference_master, run_engine_worker

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_draft_workers.py")
PAGES = 8  # sglang_draft_workers.PAGES
POOL = 64 << 20
EVICT_PAGES = 1200  # 160 KiB a page (K, V 64 KiB; draft K, V 16 KiB): about 3x the pool


def _run(python, tmp_path, name, spec, compat):
    (tmp_path / f"{name}.spec.json").write_text(json.dumps(spec))
    return run_engine_worker(python, WORKER, tmp_path / f"{name}.spec.json", tmp_path / f"{name}.out.json",
                             tmp_path / f"{name}.log", compat=compat)


def _assert_write(out, impl):
    assert out["impl"] == impl and out["group_semantics"] is True
    assert out["set"] == [[True] * PAGES, [True] * PAGES], out
    _assert_read(out)


def _assert_read(out):
    assert out["exists"] == [PAGES, PAGES], out  # target pages, draft pages
    assert out["get"] == [[True] * PAGES, [True] * PAGES], out
    assert out["exact"] is True


def test_draft_pool_with_group_ids_second_process_reads_byte_exact(engines_python, master, tmp_path):
    spec = {"mode": "write", "master": master.address, "seed": 11, "groups": True}
    _assert_write(_run(engines_python, tmp_path, "write", spec, compat=True), "ours")
    out = _run(engines_python, tmp_path, "read", dict(spec, mode="read"), compat=True)
    assert out["impl"] == "ours"
    _assert_read(out)


def _evict(engines_python, master_factory, tmp_path, groups):
    # A lease far longer than the run: the first page's read protects it throughout.
    m = master_factory(pool_size=POOL, extra_flags=["--default_kv_lease_ttl=600000",
                                                    "--eviction_high_watermark_ratio=0.9",
                                                    "--eviction_ratio=0.1"])
    spec = {"mode": "evict", "master": m.address, "seed": 5, "groups": groups, "pages": EVICT_PAGES}
    out = _run(engines_python, tmp_path, f"evict{int(groups)}", spec, compat=True)
    assert out["impl"] == "ours" and out["group_semantics"] is groups
    assert out["first_set"] == [[True], [True]] and out["first_get"] == [True]
    assert out["set_failed"] == 0, out["set_failed"]  # eviction makes room for every put
    presence = out["presence"]
    assert not all(all(p) for p in presence), "nothing was evicted: the test proves nothing"
    assert all(all(p) for p in presence[-4:])  # the newest pages stay
    assert out["survivors_exact"] is True
    return out


def test_group_ids_keep_a_page_whole_under_eviction(engines_python, master_factory, tmp_path):
    out = _evict(engines_python, master_factory, tmp_path, groups=True)
    split = [i for i, p in enumerate(out["presence"]) if any(p) and not all(p)]
    assert not split, f"pages split by eviction: {split[:10]} ({len(split)})"
    # The read leased the first page's target K/V; the group kept its draft K/V too.
    assert out["first"] == [True] * 4, out["first"]


def test_without_group_ids_the_read_page_loses_its_draft(engines_python, master_factory, tmp_path):
    """The control: the same run without group semantics evicts the first page's
    unread draft objects (the oldest) and keeps its leased target K/V."""
    out = _evict(engines_python, master_factory, tmp_path, groups=False)
    assert out["first"] == [True, True, False, False], out["first"]


def test_draft_pool_with_group_ids_on_reference_mooncake(engines_python, tmp_path):
    with reference_master(tmp_path) as m:
        spec = {"mode": "write", "master": m.address, "seed": 11, "groups": True}
        _assert_write(_run(engines_python, tmp_path, "ref_write", spec, compat=False), "reference")
