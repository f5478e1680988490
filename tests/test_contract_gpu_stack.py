"""Contract: the pinned GPU stack still resolves for Colab (Python 3.12, Linux x86_64).

pip is asked with --dry-run (nothing installed, ~2 minutes, needs PyPI); the
answer is cached under .cache/ for the same pins.
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.contract
ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "check_gpu_pins.py"


@pytest.fixture(scope="module")
def resolution():
    sys.path.insert(0, str(TOOL.parent))
    try:
        from check_gpu_pins import gpu_requirements
    finally:
        sys.path.pop(0)
    key = hashlib.sha256(json.dumps(gpu_requirements()).encode()).hexdigest()[:16]
    cached = ROOT / ".cache" / f"gpu-pins-{key}.json"
    if not cached.is_file():
        cached.parent.mkdir(exist_ok=True)
        proc = subprocess.run([sys.executable, str(TOOL), "--report", str(cached)],
                              capture_output=True, text=True, timeout=1200)
        if not cached.is_file():
            pytest.fail(f"check_gpu_pins.py produced no report:\n{proc.stderr[-2000:]}")
    return json.loads(cached.read_text())


def test_pinned_gpu_stack_resolves_on_colab_python(resolution):
    assert resolution["resolved"], resolution.get("error")


def test_pip_keeps_every_pin(resolution):
    assert resolution["mismatched"] == {}


def test_resolution_has_a_cuda_torch_unsloth_accepts(resolution):
    major, minor = (int(x) for x in resolution["versions"]["torch"].split(".")[:2])
    assert (2, 4) <= (major, minor) < (2, 15)
