"""dev/wheelhouse.py: the lent GPU machine's wheelhouse, planned from the pins (no download: the lock is committed)."""

from __future__ import annotations

import copy
import doctest
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from dev import wheelhouse as wh

LOCK = wh.read_lock()


def test_the_lock_is_made_from_the_current_pins():
    assert wh.stale_pins(LOCK) == [], (
        "pyproject.toml's pins changed since dev/wheelhouse.lock.json was made: run "
        "`python dev/wheelhouse.py lock` (needs PyPI) and commit the lock")


def test_the_file_list_carries_every_pin_the_image_lacks():
    plan = {row["name"]: row for row in wh.plan(LOCK)}
    image = wh.image_packages()
    for text in wh.pins():
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name in plan:
            assert req.specifier.contains(plan[name]["version"]), f"{text}: the wheelhouse has {plan[name]['version']}"
        else:  # left to the image: a version it is known to have, or an uncapped requirement checked on the machine
            assert name in image, f"{text} is neither carried nor on the image"
            if image[name]:
                assert req.specifier.contains(image[name].split("+")[0]), f"{text}: the image has {image[name]}"
            else:
                assert all(s.operator in (">=", ">") for s in req.specifier), f"{text}: capped, yet left to the image"
    pinned = {"trl": "1.13.0", "datasets": "4.8.5", "peft": "0.21.2", "bitsandbytes": "0.50.2",
              "unsloth": "2026.10.3", "unsloth-zoo": "2026.10.3"}
    assert {n: plan[n]["version"] for n in pinned} == pinned
    assert image["transformers"] == "5.17.0" and "transformers" not in plan  # the image's: never replaced
    assert not set(plan) & set(wh.PROTECTED)
    assert not set(plan) & set(wh.DROPPED)
    for row in plan.values():
        assert wh.wheel_fits_machine(row["file"]), f"{row['file']} does not install on CPython 3.12 manylinux x86-64"
        assert len(row["sha256"] or "") == 64
    assert plan["bitsandbytes"]["slim"]["keep"] == [f"bitsandbytes/libbitsandbytes_cuda{wh.CUDA}.so",
                                                    "bitsandbytes/libbitsandbytes_cpu.so"]
    assert plan["unsloth"]["slim"]["drop"] == ["studio/*"]


def test_every_requirement_of_the_carried_wheels_is_met():
    assert wh.unmet_requirements(LOCK) == []


def test_a_missing_or_wrong_package_is_caught():
    no_dill = copy.deepcopy(LOCK)
    no_dill["packages"] = [p for p in no_dill["packages"] if p["name"] != "dill"]
    assert any(line.startswith("datasets: dill") and "neither carried nor on the image" in line
               for line in wh.unmet_requirements(no_dill))
    old_hub = dict(wh.image_packages(), **{"huggingface-hub": "0.20.0"})
    assert any("the image has 0.20.0" in line for line in wh.unmet_requirements(LOCK, old_hub))
    unknown_capped = dict(wh.image_packages(), fsspec=None)
    capped = copy.deepcopy(LOCK)
    capped["packages"] = [p for p in capped["packages"] if p["name"] != "fsspec"]
    assert any("capped, and the image's version is unknown" in line
               for line in wh.unmet_requirements(capped, unknown_capped))


def test_slimming_keeps_only_the_machines_cuda_library_and_drops_unsloths_web_app():
    libs = [f"bitsandbytes/libbitsandbytes_{v}.so" for v in ("cuda118", "cuda128", "cuda130", "cuda132", "rocm64",
                                                              "xpu2025", "cpu")]
    assert wh.slim_members("bitsandbytes", libs + ["bitsandbytes/functional.py"]) == [
        lib for lib in libs if not lib.endswith(("cuda130.so", "cpu.so"))]
    assert wh.slim_members("unsloth", ["studio/backend/app.py", "unsloth/__init__.py", "unsloth_cli/__init__.py"]) \
        == ["studio/backend/app.py"]
    assert wh.slim_members("trl", ["trl/__init__.py"]) == []


def make_wheel(path: Path, files: dict[str, str], record: bool = True) -> Path:
    dist = "demo-1.0.dist-info"
    files = {**files, f"{dist}/METADATA": "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             f"{dist}/top_level.txt": "demo\nstudio\n"}
    rows = [f"{name},{wh.record_hash(text.encode())},{len(text.encode())}" for name, text in files.items()]
    files[f"{dist}/RECORD"] = "\n".join(rows + [f"{dist}/RECORD,,"]) + "\n" if record else "\n".join(rows) + "\n"
    with zipfile.ZipFile(path, "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)
    return path


def test_a_repacked_wheel_has_a_valid_record_and_installs(tmp_path):
    (tmp_path / "src").mkdir()
    src = make_wheel(tmp_path / "src" / "demo-1.0-py3-none-any.whl",
                     {"demo/__init__.py": "X = 1\n", "studio/app.py": "print('web')\n", "studio/big.js": "x" * 5000})
    assert wh.check_record(src) == []
    (tmp_path / "out").mkdir()
    dst = tmp_path / "out" / src.name
    slim = wh.repack(src, dst, ["studio/app.py", "studio/big.js"])
    assert slim == {"dropped_files": 2, "dropped_bytes": len("print('web')\n") + 5000}
    assert wh.check_record(dst) == []
    with zipfile.ZipFile(dst) as whl:
        assert not [n for n in whl.namelist() if n.startswith("studio/")]
        assert whl.read("demo-1.0.dist-info/top_level.txt").decode().split() == ["demo"]
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
                           "--disable-pip-version-check", "--target", str(site), str(dst)],
                          capture_output=True, text=True, env=wh.pip_env())
    assert proc.returncode == 0, proc.stderr
    assert (site / "demo" / "__init__.py").is_file() and not (site / "studio").exists()


def test_a_wrong_record_is_caught(tmp_path):
    good = make_wheel(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": "X = 1\n"})
    bad = tmp_path / "bad" / good.name
    bad.parent.mkdir()
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, b"X = 2\n" if name == "demo/__init__.py" else zin.read(name))
    assert any("does not match its RECORD" in p for p in wh.check_record(bad))
    (tmp_path / "unlisted").mkdir()
    unlisted = make_wheel(tmp_path / "unlisted" / good.name, {"demo/__init__.py": "X = 1\n"}, record=False)
    assert any("RECORD is not in RECORD" in p for p in wh.check_record(unlisted))


def test_machine_tags_and_sizes():
    assert wh.wheel_fits_machine("trl-1.13.0-py3-none-any.whl")
    assert wh.wheel_fits_machine("msgspec-0.22.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl")
    assert wh.wheel_fits_machine("torchao-0.18.0-cp310-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl")
    assert not wh.wheel_fits_machine("msgspec-0.22.0-cp311-cp311-manylinux2014_x86_64.whl")
    assert not wh.wheel_fits_machine("x-1.0-cp312-cp312-manylinux_2_39_x86_64.whl")  # newer glibc than allowed
    assert not wh.wheel_fits_machine("x-1.0-cp312-cp312-macosx_11_0_arm64.whl")
    assert 0 < wh.tree_bytes() < wh.LIMIT


def test_the_docstring_examples():
    assert doctest.testmod(wh).failed == 0
