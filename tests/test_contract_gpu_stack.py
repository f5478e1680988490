"""Contract: the install cell lands on Colab's GPU image as it is (Python 3.13, its own torch build).

pip is asked with ``--dry-run`` (``dev/check_gpu_pins.py``: nothing installed, ~2 minutes, needs PyPI)
to resolve the course's ``gpu`` extra against the image's preinstalled packages; the answer is cached
under ``.cache/`` for the same requirements, image and tool.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.contract
ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "dev" / "check_gpu_pins.py"
FREEZE = ROOT / "dev" / "colab" / "pip-freeze.gpu.txt"
SHARED = ROOT.parent / "shared" / "colab" / "pip-freeze.gpu.txt"


@pytest.fixture(scope="module")
def resolution():
    key = hashlib.sha256(b"".join(p.read_bytes() for p in (ROOT / "pyproject.toml", FREEZE, TOOL))).hexdigest()[:16]
    cached = ROOT / ".cache" / f"gpu-pins-{key}.json"
    if not cached.is_file():
        cached.parent.mkdir(exist_ok=True)
        proc = subprocess.run([sys.executable, str(TOOL), "--report", str(cached)], capture_output=True, text=True,
                              timeout=1500)
        if not cached.is_file():
            pytest.fail(f"check_gpu_pins.py produced no report:\n{proc.stderr[-3000:]}")
    return json.loads(cached.read_text())


def test_the_gpu_stack_resolves_on_colabs_image(resolution):
    assert resolution["resolved"], resolution.get("error")
    assert resolution["python"] == "3.13"


def test_the_install_keeps_the_images_torch_torchvision_and_torchaudio(resolution):
    assert resolution["torch_trio_kept"], resolution["torch_trio"]
    assert not {"torch", "torchvision", "torchaudio"} & set(resolution["changed"])


def test_the_install_keeps_the_widgets_colabs_frontend_renders(resolution):
    assert resolution["ipywidgets_kept"]


def test_every_pin_resolves_to_itself(resolution):
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in project["dependencies"] + project["optional-dependencies"]["gpu"]:
        if "==" in req:
            name, version = req.split("==")
            key = name.lower().replace("_", "-")
            assert resolution["versions"].get(key, version) == version, f"pip chose another {name} than {version}"


@pytest.mark.skipif(not SHARED.is_file(), reason="no ../shared/colab beside this checkout")
def test_the_image_list_is_the_published_one():
    assert FREEZE.read_text() == SHARED.read_text()
