"""docs/arms.md's table of arms is the registry's (evil_moe/rl/arms/registry.py), row for row."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent



def test_the_arms_table_lists_every_registered_arm():
    """docs/arms.md's "Every arm" table has one row per arm of the registry, with the arm's role,
    matched control and judged view (a new arm without its row fails here)."""
    from evil_moe.rl.arms.registry import ARMS

    text = (REPO / "docs" / "arms.md").read_text()
    table = text[text.index("## Every arm"):]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
        elif rows and not line.startswith("|"):
            if line.strip():
                break
    assert set(rows) == set(ARMS), sorted(set(rows) ^ set(ARMS))
    for name, arm in ARMS.items():
        _, role, _, control, view = rows[name]
        assert role == arm.role.replace("_", " "), name
        assert control == (f"`{arm.control}`" if arm.control else "—"), name
        assert view == arm.views[0], name
