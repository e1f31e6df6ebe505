"""The documentation against the tree: docs/architecture.md's module map names
every source file and only files that exist, README.md and architecture.md stay
short enough to read, the user documents carry no dates or commit hashes, every
relative link resolves, and nothing cites design files that are not in the
repository. Reads files only: needs no build.

The module map's format: under "### Module map", each "#### `folder/`" heading
names a folder; each bullet "- `name`, `name` — what they do" names files, a
name resolving to folder/name or, when that does not exist, to the one file
under folder whose path ends in /name.
"""
import os
import re
import subprocess

import pytest


def _checkout_root():
    """The nearest folder above this file that holds pyproject.toml (the test may move
    between area folders of tests/)."""
    d = os.path.dirname(os.path.abspath(__file__))
    while not os.path.isfile(os.path.join(d, "pyproject.toml")) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    return d


ROOT = _checkout_root()
ARCHITECTURE = os.path.join(ROOT, "docs", "architecture.md")
README = os.path.join(ROOT, "README.md")
# Written by `python -m mooncake_cxl.bench --report`: a measurement log with its own
# dates and commits, and a link target that exists once a report was generated.
GENERATED = {os.path.join("docs", "performance.md")}
SEPARATOR = " — "


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def rel(path):
    return os.path.relpath(path, ROOT)


def files_under(folder):
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        out += [rel(os.path.join(dirpath, f)) for f in filenames]
    return out


def source_files():
    """cpp/**/*.h|.cc, python/**/*.cc|.py, mooncake_cxl/**/*.py, relative to the root."""
    wanted = [("cpp", (".h", ".cc")), ("python", (".cc", ".py")), ("mooncake_cxl", (".py",))]
    return {f for top, exts in wanted for f in files_under(top) if f.endswith(exts)}


def module_map():
    """[(line number, folder, [names])] of the module map's bullets."""
    lines = read(ARCHITECTURE).splitlines()
    start = next((i for i, l in enumerate(lines) if l.strip() == "### Module map"), None)
    assert start is not None, "docs/architecture.md has no '### Module map' section"
    bullets, folder = [], None
    for n, line in enumerate(lines[start + 1:], start + 2):
        if line.startswith("## ") or line.startswith("### "):
            break
        heading = re.fullmatch(r"#### `([^`]+/)`", line.strip())
        if heading:
            folder = heading.group(1)
        elif line.startswith("- "):
            assert folder is not None, f"architecture.md:{n}: a bullet before any '#### `folder/`' heading"
            assert SEPARATOR in line, f"architecture.md:{n}: a map bullet needs '{SEPARATOR.strip()}' after its names"
            names = re.findall(r"`([^`]+)`", line[2:line.index(SEPARATOR)])
            assert names, f"architecture.md:{n}: a map bullet without a `name`"
            bullets.append((n, folder, names))
    assert bullets, "the module map lists no files"
    return bullets


def resolve(folder, name):
    """The files that `name` under `folder` names: folder/name, else every file
    under folder whose path ends in /name."""
    exact = os.path.normpath(os.path.join(folder, name))
    if os.path.isfile(os.path.join(ROOT, exact)):
        return [exact]
    return sorted(f for f in files_under(folder) if ("/" + f).endswith("/" + name))


def mapped_files():
    named, problems = set(), []
    for n, folder, names in module_map():
        for name in names:
            hits = resolve(folder, name)
            if len(hits) == 1:
                named.add(hits[0])
            elif not hits:
                problems.append(f"architecture.md:{n}: `{name}` under `{folder}` names no file")
            else:
                problems.append(f"architecture.md:{n}: `{name}` under `{folder}` is ambiguous: {hits}")
    return named, problems


def test_module_map_names_only_existing_files():
    _, problems = mapped_files()
    assert not problems, "\n".join(problems)


def test_module_map_names_every_source_file():
    named, _ = mapped_files()
    missing = sorted(source_files() - named)
    assert not missing, "source files missing from docs/architecture.md's module map:\n" + "\n".join(missing)


@pytest.mark.parametrize("path,limit", [(README, 450), (ARCHITECTURE, 950)], ids=["README", "architecture"])
def test_length(path, limit):
    n = len(read(path).splitlines())
    assert n <= limit, f"{rel(path)} has {n} lines, more than {limit}"


def markdown_documents():
    docs = os.path.join(ROOT, "docs")
    return [README] + sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))


def user_documents():
    return [p for p in markdown_documents() if rel(p) not in GENERATED]


def without_code_blocks(text):
    """The text with fenced code blocks blanked (line numbers kept)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return out


ISO_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
HEX = re.compile(r"\b[0-9a-f]{7,40}\b")


@pytest.mark.parametrize("path", user_documents(), ids=rel)
def test_no_dates_or_commit_hashes(path):
    problems = []
    for n, line in enumerate(read(path).splitlines(), 1):
        problems += [f"{rel(path)}:{n}: date {m}" for m in ISO_DATE.findall(line)]
        problems += [f"{rel(path)}:{n}: commit-like hash {m}" for m in HEX.findall(line)
                     if re.search(r"[a-f]", m) and re.search(r"\d", m)]
    assert not problems, "\n".join(problems)


def anchors(path):
    """GitHub's heading anchors of a Markdown file."""
    seen, out = {}, set()
    for line in without_code_blocks(read(path)):
        m = re.match(r"#{1,6} (.+)", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        k = seen.get(slug, 0)
        seen[slug] = k + 1
        out.add(slug if k == 0 else f"{slug}-{k}")
    return out


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("path", markdown_documents(), ids=rel)
def test_relative_links_resolve(path):
    problems = []
    for n, line in enumerate(without_code_blocks(read(path)), 1):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(dest):
                if rel(dest) not in GENERATED:
                    problems.append(f"{rel(path)}:{n}: {target}: no such file")
                continue
            if anchor and dest.endswith(".md") and anchor not in anchors(dest):
                problems.append(f"{rel(path)}:{n}: {target}: no such heading in {rel(dest)}")
    assert not problems, "\n".join(problems)


def repository_files():
    """Every file of the checkout (git's list when there is one), relative to the root."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, check=True, timeout=60)
        return [f for f in out.stdout.decode("utf-8", "replace").split("\0") if f]
    except (OSError, subprocess.SubprocessError):
        files = []
        for dirpath, dirnames, filenames in os.walk(ROOT):
            dirnames[:] = [d for d in dirnames if d not in ("build", "__pycache__") and not d.startswith(".")]
            files += [rel(os.path.join(dirpath, f)) for f in filenames]
        return files


# Named in pieces so that this file does not mention them itself.
OUTSIDE_DESIGN_FILES = ("DESIGN" + ".md", "MOONCAKE_API" + ".md")


def test_nothing_cites_design_files_outside_the_repository():
    problems = []
    for f in repository_files():
        path = os.path.join(ROOT, f)
        if not os.path.isfile(path):
            continue
        try:
            text = read(path)
        except UnicodeDecodeError:
            continue
        problems += [f"{f}: {name}" for name in OUTSIDE_DESIGN_FILES if name in text]
    assert not problems, "\n".join(problems)
