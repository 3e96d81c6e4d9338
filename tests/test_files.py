"""The ground floor for files (evil_moe/files.py): atomic writes with the umask's mode and a
content hash beside them, and readers that refuse a damaged file with one line naming it."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evil_moe import files


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def test_every_writer_gives_the_umask_mode(tmp_path, umask_027):
    """files.py promises the umask's mode whichever library writes the bytes: safetensors'
    save_file (through atomic_path) created its files 0600 on 09ede95, torch.save 0640."""
    from safetensors.torch import save_file

    with files.atomic_path(tmp_path / "a.safetensors") as tmp:
        save_file({"x": torch.zeros(2)}, str(tmp))
    with files.atomic_path(tmp_path / "b.pt") as tmp:
        torch.save({"x": 1}, tmp)
    files.atomic_write_bytes(tmp_path / "c.json", b"{}")
    for name in ("a.safetensors", "b.pt", "c.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o640, name


def test_the_adapter_file_gets_the_umask_mode(tmp_path, umask_027):
    """A saved adapter (SVDAdapter.save, the pilots' adapter.safetensors): 0600 on 09ede95."""
    from evil_moe.model.adapter import SVDAdapter

    model = torch.nn.Sequential()
    model.add_module("q_proj", torch.nn.Linear(4, 3))
    path = SVDAdapter.attach(model, ["q_proj"], base_model_id="toy").save(tmp_path / "adapter.safetensors")
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_writer_records_the_hash_and_a_reader_checks_it(tmp_path):
    """The SHA-256 of what was written sits beside it in sha256sum's format (the tool itself
    verifies it); one changed byte is refused by every reader, naming the file, the cause and
    what to do; a file without a record (a user's) is read unchecked."""
    tsv = tmp_path / "t.tsv"
    files.atomic_write_bytes(tsv, b"a\tb\n1\t2\n")
    record = files.hash_record(tsv)
    assert record.name == ".t.tsv.sha256"
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "-c", "--quiet", record.name], cwd=tmp_path, check=True)
    assert files.read_tsv_rows(tsv) == [{"a": "1", "b": "2"}]
    tsv.write_bytes(b"a\tb\n1\t3\n")
    for read in (files.read_tsv_rows, lambda p: files.read_tsv(p, ["a"]), files.check_intact):
        with pytest.raises(files.DamagedFile) as err:
            read(tsv)
        msg = str(err.value)
        assert "\n" not in msg and str(tsv) in msg and "damaged" in msg and "SHA-256" in msg
        assert "remove it and run again" in msg and ".t.tsv.sha256" in msg
    record.unlink()  # changed on purpose: the message's second way out
    assert files.read_tsv_rows(tsv) == [{"a": "1", "b": "3"}]


def test_a_cut_gzip_file_is_named(tmp_path):
    """A JSON-lines gzip cut short (the teacher's rollouts.jsonl.gz): with its record, the hash
    names it; without one (written by hand, or before records), the reader still names the file
    and the cause, never an EOFError (which click prints as a bare "Aborted!")."""
    path = tmp_path / "rollouts.jsonl.gz"
    files.write_jsonl_gz(path, [{"i": i, "text": "x" * 50} for i in range(2000)])
    assert len(files.read_jsonl(path)) == 2000
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(files.DamagedFile, match=r"rollouts.jsonl.gz is damaged: its SHA-256"):
        files.read_jsonl(path)
    files.hash_record(path).unlink()
    with pytest.raises(files.DamagedFile, match=r"rollouts.jsonl.gz is damaged after line \d+ \(cut short\)"):
        files.read_jsonl(path)
    path.write_bytes(b"not gzip at all")
    with pytest.raises(files.DamagedFile, match=r"rollouts.jsonl.gz is damaged after line 0"):
        files.read_jsonl(path)


def test_a_cut_json_file_is_named_with_the_way_out(tmp_path):
    """A cut gate.json: one line naming it and how to recover (remove it and run again)."""
    path = tmp_path / "gate.json"
    path.write_text('{"verdict": "sepa')
    with pytest.raises(files.DamagedFile) as err:
        files.read_json(path, "gate")
    assert str(err.value) == (f"{path} is damaged: not JSON (Unterminated string starting at: line 1 column 13): "
                              "remove it and run again (the workflow remakes it)")
    with pytest.raises(FileNotFoundError, match="gate not found"):
        files.read_json(tmp_path / "none.json", "gate")


def test_a_run_killed_between_record_and_rename_leaves_no_complete_looking_file(tmp_path, monkeypatch):
    """The record is written before the file is renamed into place: a rename that never comes
    (a kill) leaves the old file with the new record, which reads as damaged, not complete."""
    path = tmp_path / "x.json"
    files.write_json(path, {"old": 1})
    replace = os.replace

    def killed(src, dst):
        if Path(dst) == path:  # the record's rename went through, the file's does not come
            raise KeyboardInterrupt
        replace(src, dst)

    monkeypatch.setattr(files.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        files.write_json(path, {"new": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"old": 1}
    with pytest.raises(files.DamagedFile):
        files.read_json(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".x.json.sha256", "x.json"]  # no temp file


ENOSPC_SCRIPT = """
import sys
from pathlib import Path
from evil_moe import files
folder = Path(sys.argv[1])
files.atomic_write_bytes(folder / "small.bin", b"x" * 100)
try:
    files.atomic_write_bytes(folder / "big.bin", b"y" * 200_000)
except OSError as err:
    print("ERR", err)
print("LEFT", sorted(p.name for p in folder.iterdir()))
print("SMALL", files.check_intact(folder / "small.bin").read_bytes() == b"x" * 100)
"""


def in_small_tmpfs(script: str, *args: str, size: str = "64k") -> subprocess.CompletedProcess:
    """Run ``python -c script <folder> *args`` with ``<folder>`` a tmpfs of ``size`` bytes, in a
    user and mount namespace of its own (no root needed); skips where none can be made."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no user and mount namespace here: {probe.stderr.decode().strip()}")
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"evil_moe_tmpfs_{os.getpid()}"
    folder.mkdir(exist_ok=True)
    try:
        shell = (f"mount -t tmpfs -o size={size} tmpfs {folder} && "
                 f"exec {sys.executable} -c \"$0\" {folder} \"$@\"")
        return subprocess.run(["unshare", "-rm", "sh", "-c", shell, script, *args], capture_output=True,
                              text=True, timeout=120)
    finally:
        folder.rmdir()


def test_a_full_disk_is_one_line_naming_the_file():
    """A write that meets a full disk raises OSError naming the file and the cause; nothing of it
    is left, and what was there stays intact."""
    proc = in_small_tmpfs(ENOSPC_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["ERR"].startswith("[Errno 28] cannot write ") and lines["ERR"].endswith(
        "big.bin: No space left on device"), lines["ERR"]
    assert lines["LEFT"] == str([".small.bin.sha256", "small.bin"]) and lines["SMALL"] == "True"
