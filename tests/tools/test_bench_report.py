"""The benchmark's performance document (mooncake_cxl.bench --report): each run
rewrites the sections it ran, every section with its own command, commit,
machine, pool and date, and keeps the other sections as they were; without
--report a run writes nothing where it runs."""
import os
import subprocess
import sys

from mooncake_cxl.bench import report

CONTEXT = {"command": "python -m mooncake_cxl.bench --only data", "commit": "abc1234", "machine": "a machine",
           "pool": "/dev/shm (tmpfs, 4 KiB pages)", "date": "2026-01-01 00:00 UTC"}


def test_update_rewrites_its_sections_and_keeps_the_others(tmp_path):
    path = tmp_path / "docs" / "performance.md"
    report.update(str(path), {"data": "| data table |"}, CONTEXT)
    first = path.read_text()
    assert first.startswith(report.PREAMBLE)
    data = report.sections_of(first)["data"]
    for line in ("## Data path", "- Command: `python -m mooncake_cxl.bench --only data`", "- Commit: abc1234",
                 "- Machine: a machine", "- Pool: /dev/shm (tmpfs, 4 KiB pages)", "- Date: 2026-01-01 00:00 UTC",
                 "| data table |"):
        assert line + "\n" in data
    later = dict(CONTEXT, command="python -m mooncake_cxl.bench --only control", date="2026-01-02 00:00 UTC")
    report.update(str(path), {"control": "| control table |", "summary": "| headline |"}, later)
    second = path.read_text()
    sections = report.sections_of(second)
    assert sections["data"] == data  # not run this time: as it was, its own provenance with it
    assert "--only control" in sections["control"] and "2026-01-02" in sections["summary"]
    assert list(sections) == ["summary", "data", "control"]  # document order, not run order
    report.update(str(path), {"data": "| new data table |"}, later)
    third = path.read_text()
    assert third.count("<!-- section: data -->") == 1 and "| data table |" not in third
    assert "| new data table |" in report.sections_of(third)["data"]
    assert report.sections_of(third)["control"] == sections["control"]


def test_sections_of_an_older_file_survive(tmp_path):
    path = tmp_path / "performance.md"
    path.write_text("# old\n\n<!-- section: retired -->\n## Retired\n\nold text\n<!-- end: retired -->\n")
    report.update(str(path), {"data": "x"}, CONTEXT)
    assert list(report.sections_of(path.read_text())) == ["data", "retired"]
    assert "old text" in path.read_text()


def test_provenance_of_this_machine():
    ctx = report.run_context(["--only", "data", "--report"], "/dev/shm")
    assert ctx["command"] == "python -m mooncake_cxl.bench --only data --report"
    assert "cores" in ctx["machine"] and "memory" in ctx["machine"]
    assert "KiB pages" in ctx["pool"] or "MiB pages" in ctx["pool"]
    assert ctx["commit"]


def test_outputs_default_outside_the_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert report.output_dir() == str(tmp_path / "cache" / "mooncake_cxl" / "bench")
    monkeypatch.chdir(tmp_path)
    # the installed package, run from outside any checkout: the report goes to the cache too
    assert report.default_report_path() == str(tmp_path / "cache" / "mooncake_cxl" / "bench" / "performance.md")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mooncake-cxl"\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert report.default_report_path() == str(tmp_path / "docs" / "performance.md")


def _bench(args, cwd, env):
    return subprocess.run([sys.executable, "-m", "mooncake_cxl.bench", "--quick", *args], cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=600)  # a hang guard


def test_runs_build_up_one_document(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    work = tmp_path / "work"
    work.mkdir()
    r = _bench(["--only", "eviction"], work, env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "## Eviction and master memory" in r.stdout
    assert list(work.iterdir()) == [] and not (tmp_path / "cache").exists()  # nothing written
    doc = tmp_path / "perf.md"
    r = _bench(["--only", "eviction", "--report", str(doc)], work, env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"section(s) of {doc}" in r.stdout
    eviction = report.sections_of(doc.read_text())["eviction"]
    assert f"- Command: `python -m mooncake_cxl.bench --quick --only eviction --report {doc}`" in eviction
    assert "bytes/object" in eviction
    r = _bench(["--only", "control", "--report", str(doc)], work, env)
    assert r.returncode == 0, r.stderr[-3000:]
    sections = report.sections_of(doc.read_text())
    assert sections["eviction"] == eviction and "rings median" in sections["control"]
    assert list(work.iterdir()) == []
