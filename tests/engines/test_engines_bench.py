"""The benchmark's engines section (`python -m mooncake_cxl.bench --only
engines --quick`) end to end, as a user runs it: SGLang's and LMCache's
backends on ours and on Mooncake 0.3.13 (the section re-runs itself under
`unshare -n`). A smoke run: every row is there, byte-exact, with positive
figures; the figures themselves are not judged."""
import json
import os
import subprocess
import sys

import pytest

from engines_common import NO_TORCHVISION
from mooncake_cxl.bench import engines, reference


def test_engines_section_quick_run_reports_every_row(engines_python, tmp_path):
    why = reference.netns_skip_reason("Mooncake's client")
    if why:
        pytest.skip(why)
    env = dict(os.environ, MCXL_ENGINES_PYTHON=engines_python, PYTHONPATH=NO_TORCHVISION)
    out = tmp_path / "engines.json"
    r = subprocess.run([sys.executable, "-m", "mooncake_cxl.bench", "--only", "engines", "--quick",
                        "--json", str(out)], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                       timeout=900)  # a hang guard
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    result = json.loads(out.read_text())["engines"]
    assert result["rounds"] == 1 and result["python"] == engines_python
    assert result["master_populate_wait_s"] is not None  # timing began on a mapped pool
    assert list(result["cases"]) == [label for label, _, _ in engines.CASES]
    for label, per in result["cases"].items():
        fields = ("put_gbps", "get_gbps") if "LMCache" in label else ("set_gbps", "get_gbps")
        for impl in ("ours", "mooncake"):
            assert len(per[impl]) == 1, (label, impl)
            row = per[impl][0]
            assert row["exact"] is True, (label, impl, row)
            bounds = tuple(f.replace("_gbps", "_memcpy_gbps") for f in fields) if impl == "ours" else ()
            assert all(row[f] > 0 for f in fields + bounds), (label, impl, row)
            shares = [row[f.replace("_gbps", "_in_store")] for f in fields]
            assert all(0 < x <= 1 for x in shares), (label, impl, row)  # inside the engine's batch
    table = engines.markdown(result)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 2 * len(engines.CASES) and all(line.endswith("| yes |") for line in rows)
    assert table.splitlines()[0] in r.stdout
