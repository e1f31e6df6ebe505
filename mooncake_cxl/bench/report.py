"""The performance document (`--report [PATH]`): one markdown file that each
run rewrites section by section, never appends to.

Contract:
  * A section is the text between `<!-- section: KEY -->` and
    `<!-- end: KEY -->`. update() replaces the sections a run produced and
    keeps every other section of the existing file as it was, so a document
    can be built up by several runs; sections are kept in ORDER (unknown keys
    of an older file after the known ones).
  * Every section carries its own provenance (run_context()): the exact
    command, the commit of the checkout (or "unknown" and the installed
    version), the machine (common.machine: lscpu's model name, cores,
    memory, kernel, Python), the pool's medium and page size, and the date.
  * Without --report nothing is written into a source checkout: files a run
    writes go to output_dir() unless told otherwise.
"""
import datetime
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import urllib.parse
import urllib.request

from .. import checkout
from . import common

DOCUMENT = os.path.join("docs", "performance.md")
# (key, title), in document order
ORDER = (
    ("summary", "Headline figures beside their same-run baselines"),
    ("data", "Data path"),
    ("cold", "A fresh pool: first puts, start and setup"),
    ("control", "Control path: CXL RPC rings vs TCP"),
    ("eviction", "Eviction and master memory"),
    ("index", "Small values: the index as a capacity"),
    ("tiering", "SSD tier"),
    ("ha", "High availability: takeover and put cost"),
    ("pd_handoff", "Prefill/decode: hand-off"),
    ("pd_ttft", "Prefill/decode: TTFT in vLLM"),
    ("engines", "SGLang and LMCache backends: ours vs Mooncake 0.3.13"),
    ("remote", "Hosts outside the pod: over the Transfer Engine"),
    ("coherence", "Coherence builds: coherent, non-coherent, simulated"),
    ("compare", "Against Mooncake 0.3.13"),
)
TITLES = dict(ORDER)
PREAMBLE = """# Performance

Written by `python -m mooncake_cxl.bench ... --report`; do not edit by hand. Each
section is rewritten by the run that measured it and keeps the text of an earlier
run until then, so every section names its own command, commit, machine, pool and
date: compare figures within a section (one run), not across sections.
"""
_SECTION = re.compile(r"<!-- section: (?P<key>[\w-]+) -->\n(?P<body>.*?)<!-- end: (?P=key) -->\n?", re.S)


# ---------------------------------------------------------------- where things go

def source_checkout():
    """The source checkout this run comes from: the one this package is
    imported from (an editable install, PYTHONPATH), else the one the current
    directory is in; None when neither."""
    here = checkout.package_checkout()
    if here:
        return here
    path = os.path.abspath(os.getcwd())
    while True:
        if checkout.is_checkout(path):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def output_dir():
    """Where a run's files go by default: outside any checkout
    ($XDG_CACHE_HOME or ~/.cache, then mooncake_cxl/bench)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "mooncake_cxl", "bench")


def default_report_path():
    """docs/performance.md of the source checkout, else one in output_dir()."""
    checkout = source_checkout()
    return os.path.join(checkout if checkout else output_dir(), DOCUMENT if checkout else "performance.md")


# ---------------------------------------------------------------- provenance

def _installed_from():
    """The local directory the installed package was built from (pip's
    direct_url.json), or None."""
    try:
        raw = importlib.metadata.distribution("mooncake-cxl").read_text("direct_url.json")
        url = json.loads(raw or "{}").get("url", "")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    if not url.startswith("file://"):
        return None
    return urllib.request.url2pathname(urllib.parse.urlparse(url).path)


def commit():
    """`git rev-parse --short HEAD` of the checkout this package comes from (the
    one it is imported from, else the one it was installed from), marked when
    its tracked files differ from that commit; else "unknown" and the version."""
    for root in (checkout.package_checkout(), _installed_from()):
        if not root or not os.path.isdir(root):
            continue
        try:
            head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                                  text=True, timeout=10)
            if head.returncode != 0:
                continue
            dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--",
                                    ".", f":!{DOCUMENT}"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        return head.stdout.strip() + (" with uncommitted changes" if dirty.strip() else "")
    try:
        version = importlib.metadata.version("mooncake-cxl")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return f"unknown (mooncake-cxl {version} installed)"


def _mount_of(path):
    """(file system type, options) of the mount holding `path`, from /proc/mounts."""
    path = os.path.realpath(path)
    best = ("", "?", "")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 4:
                    continue
                point = fields[1].replace("\\040", " ")
                if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[0]):
                    best = (point, fields[2], fields[3])
    except OSError:
        pass
    return best[1], best[2]


def pool_pages(pool_dir):
    """The pool's medium and page size, e.g. "/dev/shm (tmpfs, 4 KiB pages)"."""
    try:
        block = os.statvfs(pool_dir).f_bsize
    except OSError:
        return f"{pool_dir} (page size unknown)"
    fstype, options = _mount_of(pool_dir)
    size = common.size_name(block)
    huge = next((o for o in options.split(",") if o.startswith("huge=")), None)
    extra = f", transparent huge pages {huge}" if huge and huge != "huge=never" else ""
    return f"{pool_dir} ({fstype}, {size} pages{extra})"


def run_context(argv, pool_dir):
    """The provenance of one run, as report lines."""
    command = "python -m mooncake_cxl.bench" + ("" if not argv else " " + shlex.join(argv))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {"command": command, "commit": commit(), "machine": common.machine(), "pool": pool_pages(pool_dir),
            "date": date}


# ---------------------------------------------------------------- the document

def render(key, body, context):
    """One section, markers included."""
    return (f"<!-- section: {key} -->\n## {TITLES.get(key, key)}\n\n"
            f"- Command: `{context['command']}`\n"
            f"- Commit: {context['commit']}\n"
            f"- Machine: {context['machine']}\n"
            f"- Pool: {context['pool']}\n"
            f"- Date: {context['date']}\n\n"
            f"{body.strip()}\n<!-- end: {key} -->\n")


def sections_of(text):
    """{key: rendered section} of a document."""
    return {m["key"]: m.group(0).rstrip("\n") + "\n" for m in _SECTION.finditer(text)}


def update(path, bodies, context):
    """Rewrites the document at `path`: the sections in `bodies` ({key:
    markdown}) from this run, every other section as the file had it."""
    try:
        with open(path) as f:
            kept = sections_of(f.read())
    except FileNotFoundError:
        kept = {}
    for key, body in bodies.items():
        kept[key] = render(key, body, context)
    known = [k for k, _ in ORDER if k in kept]
    keys = known + sorted(k for k in kept if k not in TITLES)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(PREAMBLE + "".join("\n" + kept[k] for k in keys))
    os.replace(tmp, path)
