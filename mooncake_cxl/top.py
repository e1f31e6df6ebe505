"""Terminal monitor for a mooncake_cxl master:

    python -m mooncake_cxl.top --url http://127.0.0.1:9003 [--interval 1] [--once]

Polls <url>/metrics (Prometheus text) every --interval seconds and shows the
pool's fill level, keys, objects per state, clients, eviction and hit rates
and per-operation request rates, plus the master's one-line summary from
<url>/metrics/summary when it answers. Rates are counter deltas between two
polls divided by the time between them.

--once prints one plain-text snapshot and exits: it polls twice, --interval
apart, so that rates are real (--interval 0: one poll, no rates). Exit codes:
0, or 2 when the master cannot be reached or sends no usable metrics. In the
live view an unreachable master shows a "disconnected, retrying" line and
polling goes on.

The pure parts (parse_metrics, sample, snapshot, format_text, build_view) are
separate from the I/O so tests need neither a master nor a terminal.
prometheus_client and rich are imported only when needed, so --help works
without them.
"""
import argparse
import math
import sys
import time
import urllib.error
import urllib.request

OPS = ("put_start", "remove", "batch_remove", "remove_by_regex", "remove_all", "attach", "ping", "heartbeat")
STATES = ("complete", "writing", "pinned", "leased", "hard_pinned", "soft_pinned")
HIGH_WATERMARK = 0.90  # the master's default --eviction_high_watermark_ratio: the bar turns red here


# ---------------------------------------------------------------------------
# Metrics: parsing and lookup
# ---------------------------------------------------------------------------

def parse_metrics(text):
    """Prometheus text -> {sample name: [(labels dict, value), ...]}.

    Raises ValueError on text that is not the Prometheus format. NaN samples
    are dropped (they carry no number to show).
    """
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not math.isnan(s.value):
                samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return samples


def _name_variants(name):
    # A counter exposed as `x` with TYPE counter is reported by
    # prometheus_client as `x` (older releases) or `x_total` (newer ones);
    # accept either spelling whichever one the caller asks for.
    base = name[: -len("_total")] if name.endswith("_total") else name
    return (name, base, base + "_total")


def sample(samples, name, **labels):
    """The value of metric `name` (with or without a `_total` suffix): the sum
    of its samples whose labels include `labels`; None when there is none."""
    for variant in _name_variants(name):
        matches = [v for have, v in samples.get(variant, ())
                   if all(have.get(k) == want for k, want in labels.items())]
        if matches:
            return sum(matches)
    return None


def _discovered_ops(samples):
    """Operations named by master_<op>_requests[_total] samples: the known
    ones first in a fixed order, then any others the master exports."""
    found = set()
    for name in samples:
        base = name[: -len("_total")] if name.endswith("_total") else name
        if base.startswith("master_") and base.endswith("_requests"):
            found.add(base[len("master_"): -len("_requests")])
    return [op for op in OPS if op in found] + sorted(found - set(OPS))


# ---------------------------------------------------------------------------
# Snapshot: figures and rates from one or two polls
# ---------------------------------------------------------------------------

def snapshot(prev_samples, cur_samples, dt):
    """Figures for display from the current poll and, when given, the previous
    one `dt` seconds earlier. Absent metrics and rates that need a previous
    poll are None. A counter that went down (master restarted) counts from 0.

    Keys: capacity_bytes, allocated_bytes, fill_ratio, key_count,
    client_count, objects {state: n}, evicted_keys_total,
    evicted_bytes_total, successful_evictions_total, evicted_keys_per_s,
    evicted_bytes_per_s, index {capacity, entries, load_ratio, watermark,
    evicted_total, evicted_per_s}, hits_total, misses_total, hit_rate_overall,
    hit_rate_interval, gets_per_s, ops {op: {requests_total, failures_total,
    requests_per_s, failures_per_s}}, interval_s.
    """
    have_prev = prev_samples is not None and dt is not None and dt > 0

    def cur(name, **labels):
        return sample(cur_samples, name, **labels)

    def delta(name):
        if not have_prev:
            return None
        now, before = cur(name), sample(prev_samples, name)
        if now is None or before is None:
            return None
        return now - before if now >= before else now

    def per_s(name):
        d = delta(name)
        return None if d is None else d / dt

    capacity, allocated = cur("master_total_capacity_bytes"), cur("master_allocated_bytes")
    hits, misses = cur("master_get_hits_total"), cur("master_get_misses_total")
    d_hits, d_misses = delta("master_get_hits_total"), delta("master_get_misses_total")
    exported = {labels.get("state") for labels, _ in cur_samples.get("master_objects", ())} - {None}
    states = [s for s in STATES if s in exported] + sorted(exported - set(STATES))
    return {
        "interval_s": dt if have_prev else None,
        "capacity_bytes": capacity,
        "allocated_bytes": allocated,
        "fill_ratio": allocated / capacity if capacity and allocated is not None else None,
        "key_count": cur("master_key_count"),
        "client_count": cur("master_client_count"),
        "objects": {s: cur("master_objects", state=s) for s in states},
        "evicted_keys_total": cur("master_evicted_key_count"),
        "evicted_bytes_total": cur("master_evicted_size_bytes"),
        "successful_evictions_total": cur("master_successful_evictions_total"),
        "evicted_keys_per_s": per_s("master_evicted_key_count"),
        "evicted_bytes_per_s": per_s("master_evicted_size_bytes"),
        # The object index: a capacity of its own (small objects fill it first).
        "index": {
            "capacity": cur("master_index_capacity"),
            "entries": cur("mooncake_cxl_index_entries_in_use"),
            "load_ratio": cur("mooncake_cxl_index_load_ratio"),
            "watermark": cur("mooncake_cxl_index_high_watermark_ratio"),
            "evicted_total": cur("mooncake_cxl_index_evicted_keys_total"),
            "evicted_per_s": per_s("mooncake_cxl_index_evicted_keys_total"),
        },
        "hits_total": hits,
        "misses_total": misses,
        "hit_rate_overall": _ratio(hits, misses),
        "hit_rate_interval": _ratio(d_hits, d_misses),
        "gets_per_s": None if d_hits is None or d_misses is None else (d_hits + d_misses) / dt,
        # Announcement channels (absent from masters that have none).
        "announce": None if cur("mooncake_cxl_announce_channels") is None else {
            "channels": cur("mooncake_cxl_announce_channels"),
            "in_use": cur("mooncake_cxl_announce_channels_in_use"),
            "refusals_total": cur("mooncake_cxl_announce_refusals_total"),
        },
        # The SSD tier (absent when the master runs without --enable_offload).
        "tier": None if cur("mooncake_cxl_tier_capacity_bytes") is None else {
            "capacity_bytes": cur("mooncake_cxl_tier_capacity_bytes"),
            "live_bytes": cur("mooncake_cxl_tier_live_bytes"),
            "used_bytes": cur("mooncake_cxl_tier_used_bytes"),
            "objects": cur("mooncake_cxl_tier_objects"),
            "demotions_total": cur("mooncake_cxl_tier_demotions_total"),
            "promotions_total": cur("mooncake_cxl_tier_promotions_total"),
            "disk_hits_total": cur("mooncake_cxl_tier_disk_hits_total"),
            "checksum_failures_total": cur("mooncake_cxl_tier_checksum_failures_total"),
            "degraded": cur("mooncake_cxl_tier_degraded"),
            "capacity_effective_bytes": cur("mooncake_cxl_tier_capacity_effective_bytes"),
            "demotions_per_s": per_s("mooncake_cxl_tier_demotions_total"),
            "disk_hits_per_s": per_s("mooncake_cxl_tier_disk_hits_total"),
        },
        "ops": {
            op: {
                "requests_total": cur(f"master_{op}_requests_total"),
                "failures_total": cur(f"master_{op}_failures_total"),
                "requests_per_s": per_s(f"master_{op}_requests_total"),
                "failures_per_s": per_s(f"master_{op}_failures_total"),
            }
            for op in _discovered_ops(cur_samples)
        },
    }


def _ratio(hits, misses):
    if hits is None or misses is None or hits + misses <= 0:
        return None
    return hits / (hits + misses)


# ---------------------------------------------------------------------------
# Rendering (pure: a snapshot in, text or a rich renderable out)
# ---------------------------------------------------------------------------

def fmt_bytes(n):
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def fmt_byte_rate(n):
    return "n/a" if n is None else fmt_bytes(n) + "/s"


def fmt_count(n):
    return "n/a" if n is None else f"{n:,.0f}"


def fmt_rate(n, unit="/s"):
    return "n/a" if n is None else f"{n:,.1f}{unit}"


def fmt_percent(r):
    return "n/a" if r is None else f"{100 * r:.1f}%"


def text_bar(ratio, width=30):
    filled = 0 if ratio is None else round(max(0.0, min(1.0, ratio)) * width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def _lines(snap):
    """(label, value) rows shared by the plain-text and the rich views."""
    objects = "  ".join(f"{s} {fmt_count(n)}" for s, n in snap["objects"].items()) or "n/a"
    return [
        ("pool", f"{fmt_percent(snap['fill_ratio'])}  {fmt_bytes(snap['allocated_bytes'])} used"
                 f" of {fmt_bytes(snap['capacity_bytes'])}"),
        ("index", _index_line(snap.get("index") or {})),
        ("keys", fmt_count(snap["key_count"])),
        ("objects", objects),
        ("clients", fmt_count(snap["client_count"])),
        ("evictions", f"{fmt_rate(snap['evicted_keys_per_s'], ' keys/s')}"
                      f"  {fmt_byte_rate(snap['evicted_bytes_per_s'])}"
                      f"  (total {fmt_count(snap['evicted_keys_total'])} keys,"
                      f" {fmt_bytes(snap['evicted_bytes_total'])},"
                      f" {fmt_count(snap['successful_evictions_total'])} successful evictions)"),
        ("hit rate", f"{fmt_percent(snap['hit_rate_interval'])} of {fmt_rate(snap['gets_per_s'], ' gets/s')}, "
                     f"{fmt_percent(snap['hit_rate_overall'])} overall  (hits {fmt_count(snap['hits_total'])},"
                     f" misses {fmt_count(snap['misses_total'])})"),
    ] + _announce_lines(snap.get("announce")) + _tier_lines(snap.get("tier"))


def _announce_lines(a):
    if not a:
        return []
    return [("channels", f"{fmt_count(a['in_use'])} in use of {fmt_count(a['channels'])}"
                         f"  (opens refused {fmt_count(a['refusals_total'])})")]


def _index_line(ix):
    return (f"{fmt_percent(ix.get('load_ratio'))}  {fmt_count(ix.get('entries'))} of"
            f" {fmt_count(ix.get('capacity'))} entries (evicts past {fmt_percent(ix.get('watermark'))})"
            f"  evicted for it {fmt_rate(ix.get('evicted_per_s'), ' keys/s')}"
            f" (total {fmt_count(ix.get('evicted_total'))})")


def _tier_lines(t):
    if not t:
        return []
    cap, live = t["capacity_bytes"], t["live_bytes"]
    if t.get("capacity_effective_bytes"):  # what the filesystem leaves, when less
        cap = min(cap, t["capacity_effective_bytes"]) if cap else t["capacity_effective_bytes"]
    fill = live / cap if cap and live is not None else None
    return [
        ("ssd tier", f"{fmt_percent(fill)}  {fmt_bytes(live)} live ({fmt_bytes(t['used_bytes'])} in segments)"
                     f" of {fmt_bytes(cap)}  objects only on disk {fmt_count(t['objects'])}"),
        ("tier moves", f"demotions {fmt_rate(t['demotions_per_s'])} (total {fmt_count(t['demotions_total'])})"
                       f"  promotions {fmt_count(t['promotions_total'])}"
                       f"  disk hits {fmt_rate(t['disk_hits_per_s'])} (total {fmt_count(t['disk_hits_total'])})"
                       f"  checksum failures {fmt_count(t['checksum_failures_total'])}"
                       + ("  DEGRADED: disk full" if t.get("degraded") else "")),
    ]


def _op_rows(snap):
    return [(op, fmt_rate(o["requests_per_s"], ""), fmt_rate(o["failures_per_s"], ""),
             fmt_count(o["requests_total"]), fmt_count(o["failures_total"])) for op, o in snap["ops"].items()]


OP_HEADER = ("operation", "req/s", "fail/s", "requests", "failures")


def _title(url, snap):
    rates = f"rates over {snap['interval_s']:.1f} s" if snap["interval_s"] else "no rates yet (one poll)"
    return f"mooncake_cxl master {url}  ({rates})"


def format_text(snap, summary=None, url=""):
    """The plain-text view (--once): one label per line, then the ops table."""
    out = [_title(url, snap)]
    if summary:
        out.append(f"{'summary':<10}: {summary}")
    for label, value in _lines(snap):
        if label == "pool":
            value = f"{text_bar(snap['fill_ratio'])} {value}"
        out.append(f"{label:<10}: {value}")
    rows = _op_rows(snap)
    if rows:
        out.append("")
        for r in [OP_HEADER, *rows]:
            out.append(f"{r[0]:<18}{r[1]:>12}{r[2]:>10}{r[3]:>14}{r[4]:>12}")
    return "\n".join(out) + "\n"


def build_view(snap, summary=None, url="", error=None, interval=1.0):
    """The live view: a rich Panel. `snap` may be None (nothing polled yet);
    `error` (a string) adds the "disconnected, retrying" line."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    parts = []
    if error:
        parts.append(Text(f"disconnected from {url}: {error}; retrying every {interval:g} s", style="bold red"))
    if snap is not None:
        if summary:
            parts.append(Text(summary, style="dim"))
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        ratio = snap["fill_ratio"]
        colour = "green" if ratio is None or ratio < 0.7 else "yellow" if ratio < HIGH_WATERMARK else "red"
        bar = ProgressBar(total=1.0, completed=min(ratio or 0.0, 1.0), width=30, complete_style=colour,
                          finished_style=colour)
        lines = _lines(snap)
        pool = Table.grid(padding=(0, 1))
        pool.add_row(bar, Text(lines[0][1]))  # lines[0] is the pool row
        for label, value in lines:
            grid.add_row(label, pool if label == "pool" else Text(value))
        parts.append(grid)
        rows = _op_rows(snap)
        if rows:
            parts.append(Text(""))
            ops = Table(*OP_HEADER, box=None, header_style="bold", padding=(0, 2, 0, 0))
            for col in ops.columns[1:]:
                col.justify = "right"
            for r in rows:
                ops.add_row(*r)
            parts.append(ops)
    title = _title(url, snap) if snap is not None else f"mooncake_cxl master {url}"
    return Panel(Group(*parts), title=title, title_align="left",
                 border_style="red" if error else "blue")


# ---------------------------------------------------------------------------
# I/O
# ---------------------------------------------------------------------------

class MasterUnreachable(Exception):
    """The master did not answer /metrics with usable Prometheus text."""


def _get(url, timeout):
    with urllib.request.urlopen(url, timeout=timeout) as r:  # raises HTTPError on 4xx/5xx
        return r.read().decode("utf-8", errors="replace")


def poll(base_url, timeout):
    """Parsed samples from <base_url>/metrics, or MasterUnreachable."""
    try:
        return parse_metrics(_get(base_url + "/metrics", timeout))
    except (OSError, ValueError) as e:  # URLError and HTTPError are OSErrors
        raise MasterUnreachable(_describe(e)) from e


def fetch_summary(base_url, timeout):
    """The first line of <base_url>/metrics/summary, or None."""
    try:
        text = _get(base_url + "/metrics/summary", timeout)
    except (OSError, ValueError):
        return None
    line = next((l.strip() for l in text.splitlines() if l.strip()), "")
    return line[:300] or None


def _describe(e):
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(e, urllib.error.URLError):
        return str(e.reason)
    if isinstance(e, ValueError):
        return f"not Prometheus text ({e})"
    return str(e) or type(e).__name__


def _normalise_url(url):
    url = url.strip().rstrip("/")
    return url if "://" in url else "http://" + url


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------

def run_once(url, interval, timeout, out=sys.stdout):
    try:
        first = poll(url, timeout)
        t0 = time.monotonic()
        prev, cur, dt = None, first, None
        if interval > 0:
            time.sleep(interval)
            try:
                prev, cur, dt = first, poll(url, timeout), time.monotonic() - t0
            except MasterUnreachable:
                pass  # show the one poll we have, without rates
    except MasterUnreachable as e:
        print(f"mooncake_cxl.top: cannot read metrics from {url}/metrics: {e}", file=sys.stderr)
        return 2
    out.write(format_text(snapshot(prev, cur, dt), fetch_summary(url, timeout), url))
    return 0


def run_live(url, interval, timeout, count=None):
    from rich.console import Console
    from rich.live import Live

    prev, prev_t, snap, summary = None, None, None, None
    polls = 0
    with Live(build_view(None, url=url), console=Console(), refresh_per_second=4) as live:
        try:
            while count is None or polls < count:
                started = time.monotonic()
                error = None
                try:
                    cur = poll(url, timeout)
                    now = time.monotonic()
                    snap = snapshot(prev, cur, None if prev_t is None else now - prev_t)
                    prev, prev_t = cur, now
                    summary = fetch_summary(url, timeout)
                except MasterUnreachable as e:
                    error = str(e)
                    prev, prev_t = None, None  # rates restart after a reconnect
                live.update(build_view(snap, summary, url, error, interval))
                polls += 1
                if count is None or polls < count:
                    time.sleep(max(0.0, interval - (time.monotonic() - started)))
        except KeyboardInterrupt:
            pass
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m mooncake_cxl.top",
                                description="Live view of a mooncake_cxl master's metrics.")
    p.add_argument("--url", default="http://127.0.0.1:9003",
                   help="the master's metrics address (its --metrics_port); default %(default)s")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls; default %(default)s")
    p.add_argument("--timeout", type=float, default=2.0,
                   help="seconds to wait for an answer; default %(default)s")
    p.add_argument("--once", action="store_true",
                   help="print one plain-text snapshot (two polls --interval apart) and exit; "
                        "exit code 2 if the master cannot be reached")
    p.add_argument("--count", type=int, default=None, help="live view: stop after this many polls")
    args = p.parse_args(argv)
    if args.interval < 0 or args.timeout <= 0:
        p.error("--interval must be >= 0 and --timeout > 0")
    url = _normalise_url(args.url)
    if args.once:
        return run_once(url, args.interval, args.timeout)
    return run_live(url, max(args.interval, 0.1), args.timeout, args.count)


if __name__ == "__main__":
    sys.exit(main())
