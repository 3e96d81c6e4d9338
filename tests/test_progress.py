"""The stages' progress bars (evil_moe/progress.py): on stderr (the job's log), plain ASCII, and
refreshed at most every MININTERVAL seconds so that a log is not flooded."""

from __future__ import annotations

from evil_moe import progress


def test_bar_goes_to_stderr_and_does_not_flood_the_log(capsys):
    with progress.bar(1000, "distill: NLL steps", "step") as b:
        for _ in range(1000):
            b.update(1)
    out, err = capsys.readouterr()
    assert out == ""
    # the first and the final state only: 1000 updates within MININTERVAL seconds draw twice
    frames = [f for f in err.split("\r") if f.strip()]
    assert len(frames) == 2, frames
    assert frames[0].startswith("distill: NLL steps:   0%") and "0/1000" in frames[0]
    assert frames[-1].startswith("distill: NLL steps: 100%") and "1000/1000" in frames[-1]
    assert err.isascii()
    assert progress.MININTERVAL >= 5


def test_bar_resumes_from_initial(capsys):
    with progress.bar(10, "pilot: steps", "step", initial=4) as b:
        b.update(6)
    err = capsys.readouterr().err
    assert "4/10" in err and "10/10" in err
