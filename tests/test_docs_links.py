"""The README and docs/ stand alone: every relative link resolves inside the repository, and no
project file points outside it (to the developers' shared folder beside the checkout)."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")
OUTSIDE = "/".join(("..", "shared"))  # spelled so that this file does not match itself
# the developers' design notes, which are not in the repository (issue 32): what a user needs is in docs/
NOT_HERE = tuple(".".join(parts) for parts in (("science", "md"), ("DESIGN", "md")))

def _pages():
    return [REPO / "README.md", REPO / "results" / "README.md", *sorted((REPO / "docs").glob("*.md"))]

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

def test_no_project_file_refers_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    hits = []
    for f in files:
        p = REPO / f
        if not p.is_file() or p.suffix in {".png", ".svg", ".gz"}:
            continue
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        if OUTSIDE in text or any(name in text for name in NOT_HERE):
            hits.append(f)
    assert not hits, f"files refer to {OUTSIDE} or to {' / '.join(NOT_HERE)}: {hits}"

