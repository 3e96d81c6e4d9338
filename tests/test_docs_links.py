"""The README and docs/ stand alone: every relative link resolves inside the repository, and no
project file points outside it (to the developers' shared folder beside the checkout, or to an
issue tracker the repository does not link)."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")
OUTSIDE = "/".join(("..", "shared"))  # spelled so that this file does not match itself
# the developers' design notes, which are not in the repository: what a user needs is in docs/
NOT_HERE = tuple(".".join(parts) for parts in (("science", "md"), ("DESIGN", "md")))
# "issue N", "issues N and M", "Issue #N", "pre-issue-N": a number on a tracker no reader has
ISSUE = re.compile(r"\b[Ii]ssues?[\s-]*#?\d+")

def _pages():
    return [REPO / "README.md", REPO / "results" / "README.md", REPO / "config" / "README.md",
            *sorted((REPO / "docs").rglob("*.md"))]

def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page."""
    out = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            text = re.sub(r"[^\w\- ]", "", text)
            out.add(text.replace(" ", "-"))
    return out

def test_every_relative_link_resolves():
    bad = []
    for page in _pages():
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists() or REPO not in (dest, *dest.parents):
                bad.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not bad, "broken links:\n" + "\n".join(bad)

def _tracked_texts():
    """(path, text) of every file git tracks that reads as text (docs, code, config, tests)."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    for f in files:
        p = REPO / f
        if not p.is_file() or p.suffix in {".png", ".svg", ".gz"}:
            continue
        try:
            yield f, p.read_text()
        except UnicodeDecodeError:
            continue


def _unlinked(index: Path, pages) -> list[str]:
    """The paths among ``pages`` that ``index`` does not link."""
    linked = {(index.parent / t.partition("#")[0]).resolve() for t in LINK.findall(index.read_text())}
    return [str(p.relative_to(REPO)) for p in sorted(pages) if p != index and p.resolve() not in linked]


def test_every_page_and_config_file_is_on_its_map():
    """docs/README.md, the documentation's map, links every page under docs/, and
    config/README.md, the catalog of configs, every file in config/: a new page or config file
    without its line fails here."""
    missing = (_unlinked(REPO / "docs" / "README.md", (REPO / "docs").rglob("*.md"))
               + _unlinked(REPO / "config" / "README.md", (REPO / "config").glob("*.yaml")))
    assert not missing, f"not on docs/README.md's or config/README.md's map: {missing}"


def test_no_project_file_refers_outside_the_repository():
    hits = [f for f, text in _tracked_texts() if OUTSIDE in text or any(name in text for name in NOT_HERE)]
    assert not hits, f"files refer to {OUTSIDE} or to {' / '.join(NOT_HERE)}: {hits}"


def test_no_file_cites_an_issue_by_number():
    """A reader cannot open the tracker an "issue N" points to: a file says what the issue was
    about (the shared-prompt sampler, the sandbox's last gaps) instead of its number, in any
    spelling ("issue N", "issues N and M", "Issue #N", "pre-issue-N", a line break between)."""
    hits = [f"{f}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
            for f, text in _tracked_texts() for m in ISSUE.finditer(text)]
    assert not hits, "issue numbers cited:\n" + "\n".join(hits)


def test_the_issue_pattern_reads_every_spelling():
    """The pattern above catches each spelling it names and leaves words that only look alike."""
    cited = ["issue N", "(Issue N)", "issues N and M", "issue #N", "pre-issue-N", "issue\nN's"]
    assert all(ISSUE.search(s.replace("N", "30")) for s in cited)
    assert not any(ISSUE.search(s) for s in ["issues", "the issue's premise", "tissue 3D", "issued 2 flags"])

