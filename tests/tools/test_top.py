"""mooncake_cxl.top, the terminal monitor: snapshot() math on canned metrics,
the plain-text and rich views, and the command itself against a tiny HTTP
server serving canned /metrics texts (the first poll gets FIRST, later ones
SECOND, so --once shows rates)."""
import http.server
import io
import socket
import subprocess
import sys
import threading

import pytest

from mooncake_cxl import top

GIB, MIB = 1 << 30, 1 << 20

FIRST = f"""\
# HELP master_total_capacity_bytes Size of the pool's data region.
# TYPE master_total_capacity_bytes gauge
master_total_capacity_bytes {GIB}
# TYPE master_allocated_bytes gauge
master_allocated_bytes {GIB // 2}
# TYPE master_key_count gauge
master_key_count 1234
# TYPE master_objects gauge
master_objects{{state="complete"}} 1200
master_objects{{state="writing"}} 30
master_objects{{state="leased"}} 4
# TYPE master_client_count gauge
master_client_count 3
# TYPE master_evicted_key_count counter
master_evicted_key_count 100
# TYPE master_evicted_size_bytes counter
master_evicted_size_bytes {MIB}
# TYPE master_successful_evictions_total counter
master_successful_evictions_total 2
# TYPE master_eviction_rounds_total counter
master_eviction_rounds_total 9
# TYPE master_index_capacity gauge
master_index_capacity 4096
# TYPE mooncake_cxl_index_entries_in_use gauge
mooncake_cxl_index_entries_in_use 3276
# TYPE mooncake_cxl_index_load_ratio gauge
mooncake_cxl_index_load_ratio 0.7998046875
# TYPE mooncake_cxl_index_high_watermark_ratio gauge
mooncake_cxl_index_high_watermark_ratio 0.8
# TYPE mooncake_cxl_index_evicted_keys_total counter
mooncake_cxl_index_evicted_keys_total 40
# TYPE master_get_hits_total counter
master_get_hits_total 900
# TYPE master_get_misses_total counter
master_get_misses_total 100
# TYPE master_put_start_requests_total counter
master_put_start_requests_total 5000
# TYPE master_put_start_failures_total counter
master_put_start_failures_total 7
# TYPE master_ping_requests_total counter
master_ping_requests_total 10
"""

# Two seconds later (as far as test_snapshot_math is concerned): 50 more keys
# and 2 MiB evicted, 80 hits and 20 misses, 1000 more put_starts.
SECOND = (FIRST.replace("master_evicted_key_count 100", "master_evicted_key_count 150")
          .replace("mooncake_cxl_index_evicted_keys_total 40", "mooncake_cxl_index_evicted_keys_total 60")
          .replace(f"master_evicted_size_bytes {MIB}", f"master_evicted_size_bytes {3 * MIB}")
          .replace("master_get_hits_total 900", "master_get_hits_total 980")
          .replace("master_get_misses_total 100", "master_get_misses_total 120")
          .replace("master_put_start_requests_total 5000", "master_put_start_requests_total 6000"))

SUMMARY = "keys=1234 used=512.0MiB/1.0GiB (50.0%) clients=3\n"


class _CannedMaster(http.server.BaseHTTPRequestHandler):
    metrics_texts = (FIRST, SECOND)  # the last one repeats
    summary = SUMMARY

    def do_GET(self):
        server = self.server
        if self.path == "/metrics":
            with server.lock:
                body = self.metrics_texts[min(server.polls, len(self.metrics_texts) - 1)]
                server.polls += 1
        elif self.path == "/metrics/summary" and self.summary is not None:
            body = self.summary
        else:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def _serve(handler):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.lock, server.polls = threading.Lock(), 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def canned_master():
    server = _serve(_CannedMaster)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def closed_port_url():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connection refused
    return f"http://127.0.0.1:{port}"


def _run_top(*args, tmp_path):
    # cwd away from the repository so the installed package is imported.
    return subprocess.run([sys.executable, "-m", "mooncake_cxl.top", *args], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)


# --- pure functions -----------------------------------------------------------

def test_snapshot_math():
    snap = top.snapshot(top.parse_metrics(FIRST), top.parse_metrics(SECOND), 2.0)
    assert snap["fill_ratio"] == 0.5
    assert snap["capacity_bytes"] == GIB and snap["allocated_bytes"] == GIB // 2
    assert snap["key_count"] == 1234 and snap["client_count"] == 3
    assert snap["objects"] == {"complete": 1200, "writing": 30, "leased": 4}
    assert snap["evicted_keys_per_s"] == 25.0
    assert snap["evicted_bytes_per_s"] == MIB
    assert snap["evicted_keys_total"] == 150 and snap["successful_evictions_total"] == 2
    assert snap["hit_rate_interval"] == pytest.approx(0.8)
    assert snap["hit_rate_overall"] == pytest.approx(980 / 1100)
    assert snap["gets_per_s"] == 50.0
    assert list(snap["ops"]) == ["put_start", "ping"]  # known order; only ops the master exports
    assert snap["ops"]["put_start"] == {"requests_total": 6000, "failures_total": 7,
                                        "requests_per_s": 500.0, "failures_per_s": 0.0}
    assert snap["ops"]["ping"]["failures_total"] is None
    assert snap["interval_s"] == 2.0


def test_snapshot_without_a_previous_poll_has_no_rates():
    snap = top.snapshot(None, top.parse_metrics(FIRST), None)
    assert snap["evicted_keys_per_s"] is None and snap["hit_rate_interval"] is None
    assert snap["ops"]["put_start"]["requests_per_s"] is None
    assert snap["hit_rate_overall"] == 0.9 and snap["interval_s"] is None


def test_snapshot_counter_reset_and_idle_interval():
    # The master restarted: counters went down, so the new value is the delta.
    snap = top.snapshot(top.parse_metrics(SECOND), top.parse_metrics(FIRST), 1.0)
    assert snap["evicted_keys_per_s"] == 100.0
    # No lookups in the interval: no interval hit rate, not a division by zero.
    snap = top.snapshot(top.parse_metrics(FIRST), top.parse_metrics(FIRST), 1.0)
    assert snap["hit_rate_interval"] is None and snap["gets_per_s"] == 0.0
    assert snap["evicted_keys_per_s"] == 0.0


def test_counter_names_with_and_without_total_suffix():
    text = ("# TYPE master_get_hits counter\nmaster_get_hits 3\n"       # counter family without _total
            "master_get_misses_total 1\n"                                  # untyped, with _total
            "master_evicted_key_count 5\n"                                 # untyped, without
            "# TYPE master_evicted_size_bytes_total counter\nmaster_evicted_size_bytes_total 7\n"
            "master_remove_requests 4\n"                                   # an op counter without _total
            "some_other_metric 1\n")
    samples = top.parse_metrics(text)
    assert top.sample(samples, "master_get_hits_total") == 3
    assert top.sample(samples, "master_get_misses") == 1
    assert top.sample(samples, "master_evicted_key_count") == 5
    assert top.sample(samples, "master_evicted_size_bytes") == 7
    snap = top.snapshot(None, samples, None)
    assert snap["hit_rate_overall"] == 0.75
    assert snap["ops"]["remove"]["requests_total"] == 4
    assert snap["fill_ratio"] is None and snap["objects"] == {}


def test_sample_sums_label_sets_and_filters_by_label():
    samples = top.parse_metrics('x_total{shard="0"} 2\nx_total{shard="1"} 3\n'
                                'master_objects{state="pinned"} 4\n')
    assert top.sample(samples, "x") == 5
    assert top.sample(samples, "x", shard="1") == 3
    assert top.sample(samples, "x", shard="9") is None
    assert top.sample(samples, "master_objects", state="pinned") == 4


def test_parse_metrics_rejects_non_prometheus_text():
    with pytest.raises(ValueError):
        top.parse_metrics("<html><body>hello</body></html>\n")


def test_text_view():
    snap = top.snapshot(top.parse_metrics(FIRST), top.parse_metrics(SECOND), 2.0)
    text = top.format_text(snap, "a summary", "http://m:9003")
    assert "[###############---------------] 50.0%  512.0 MiB used of 1.0 GiB" in text
    assert "1,234" in text and "80.0% of 50.0 gets/s" in text and "89.1% overall" in text
    assert "25.0 keys/s" in text and "1.0 MiB/s" in text
    assert "complete 1,200  writing 30  leased 4" in text
    # The index's load beside the pool's: small objects fill it first.
    assert "80.0%  3,276 of 4,096 entries (evicts past 80.0%)  evicted for it 10.0 keys/s (total 60)" in text
    assert "a summary" in text and "rates over 2.0 s" in text
    assert "put_start" in text and "500.0" in text
    # Missing metrics show as n/a rather than failing.
    assert "n/a" in top.format_text(top.snapshot(None, {}, None))


def test_rich_view_renders_snapshot_and_disconnection():
    from rich.console import Console

    def render(view):
        console = Console(file=io.StringIO(), width=120, color_system=None)
        console.print(view)
        return console.file.getvalue()

    snap = top.snapshot(top.parse_metrics(FIRST), top.parse_metrics(SECOND), 2.0)
    out = render(top.build_view(snap, "a summary", "http://m:9003"))
    assert "50.0%" in out and "1,234" in out and "80.0% of 50.0 gets/s" in out and "put_start" in out
    out = render(top.build_view(snap, None, "http://m:9003", error="connection refused", interval=1))
    assert "disconnected from http://m:9003: connection refused; retrying every 1 s" in out
    assert "1,234" in out  # the last figures stay on screen
    assert "disconnected" in render(top.build_view(None, None, "http://m:9003", error="timed out"))


# --- the command ----------------------------------------------------------------

def test_once_prints_a_snapshot_with_rates(canned_master, tmp_path):
    out = _run_top("--url", canned_master, "--once", "--interval", "0.2", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "50.0%" in out.stdout and "512.0 MiB used of 1.0 GiB" in out.stdout
    assert "keys      : 1,234" in out.stdout
    assert "80.0% of " in out.stdout and "89.1% overall" in out.stdout
    assert "n/a keys/s" not in out.stdout  # a real eviction rate
    assert SUMMARY.strip() in out.stdout


def test_once_with_zero_interval_polls_once(canned_master, tmp_path):
    out = _run_top("--url", canned_master.removeprefix("http://") + "/", "--once", "--interval", "0",
                   tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "no rates yet" in out.stdout and "90.0% overall" in out.stdout


def test_once_against_an_unreachable_master_exits_2(closed_port_url, tmp_path):
    out = _run_top("--url", closed_port_url, "--once", "--interval", "0", tmp_path=tmp_path)
    assert out.returncode == 2
    assert f"cannot read metrics from {closed_port_url}/metrics" in out.stderr
    assert out.stdout == ""


def test_once_against_a_server_without_metrics_exits_2(tmp_path):
    class NoMetrics(_CannedMaster):
        metrics_texts = ("<html>not metrics</html>\n",)
        summary = None

    server = _serve(NoMetrics)
    try:
        out = _run_top("--url", f"http://127.0.0.1:{server.server_address[1]}", "--once", "--interval", "0",
                       tmp_path=tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert out.returncode == 2 and "not Prometheus text" in out.stderr


def test_live_view_shows_figures_and_disconnection(canned_master, closed_port_url, tmp_path):
    out = _run_top("--url", canned_master, "--interval", "0.1", "--count", "2", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "1,234" in out.stdout and "50.0%" in out.stdout
    out = _run_top("--url", closed_port_url, "--interval", "0.1", "--count", "2", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "disconnected" in out.stdout and "retrying" in out.stdout


def test_help_needs_neither_rich_nor_prometheus_client(tmp_path):
    # Block both imports: --help must still work.
    code = ("import sys; sys.modules['rich'] = None; sys.modules['prometheus_client'] = None;"
            "from mooncake_cxl import top; sys.argv = ['top', '--help']; top.main()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "--once" in out.stdout and "--interval" in out.stdout


def test_announcement_channels_row():
    text = ("mooncake_cxl_announce_channels 128\nmooncake_cxl_announce_channels_in_use 3\n"
            "# TYPE mooncake_cxl_announce_refusals counter\nmooncake_cxl_announce_refusals_total 2\n")
    snap = top.snapshot(None, top.parse_metrics(text), None)
    assert snap["announce"] == {"channels": 128, "in_use": 3, "refusals_total": 2}
    assert "channels  : 3 in use of 128  (opens refused 2)" in top.format_text(snap)
    assert top.snapshot(None, top.parse_metrics("master_key_count 1\n"), None)["announce"] is None
