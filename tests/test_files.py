"""The ground floor for files (evil_moe/files.py): atomic writes with the umask's mode
(issue 41, item 13)."""

from __future__ import annotations

import os

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
