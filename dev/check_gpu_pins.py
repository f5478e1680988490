"""Would the notebooks' install cell land on Colab's GPU image? Ask pip, without installing anything.

    python dev/check_gpu_pins.py [--report out.json] [--extras gpu] [--extras gpu,vllm]

Colab's image (``dev/colab/pip-freeze.gpu.txt``: Python 3.13, torch 2.11.0+cu128 with its
torchvision and torchaudio, transformers, ipywidgets 7.7.1 ...) already holds torch, torchvision and
torchaudio built together for its CUDA, and the install cell pins those three to what is installed.
This asks pip (``--dry-run``, binary wheels only, Python 3.13, Linux x86_64) to resolve the course
with the given extras the way that cell installs it:

* the image's torch trio as stand-in wheels (metadata only: the real builds are not on PyPI, and this
  registry lacks their CUDA libraries) carrying their real non-CUDA requirements, read from PyPI's
  wheels of the same versions, e.g. torch's pin on triton;
* every other preinstalled package as a constraint, released (and reported) only when a requirement
  needs another version: pip's only-if-needed upgrade on the image.

Prints one JSON object: whether it resolved, on which day (UTC), in how many seconds, what the install would change on
the image (``package: [colab, new]``), what it adds, and whether the torch trio and ipywidgets stay.
Exit status 1 when it does not resolve or when the torch trio would change.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FREEZE = ROOT / "dev" / "colab" / "pip-freeze.gpu.txt"
PYTHON = "3.13"
PLATFORMS = ["manylinux2014_x86_64"] + [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)]
TRIO = ("torch", "torchvision", "torchaudio")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def colab_packages() -> dict[str, str]:
    """``{package: version}`` of Colab's GPU image (packages from PyPI-style ``==`` lines)."""
    out = {}
    for line in FREEZE.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            out[canonical(name)] = version.strip()
    return out


def requirements(extras: list[str]) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]) + [r for e in extras for r in project["optional-dependencies"][e]]


class _HttpFile(io.RawIOBase):
    """Enough of a file over HTTP range requests for ``zipfile`` to read one member of a remote wheel."""

    def __init__(self, url: str) -> None:
        self.url, self.pos = url, 0
        head = urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=60)
        self.size = int(head.headers["Content-Length"])

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"})
        data = urllib.request.urlopen(request, timeout=120).read()
        self.pos += len(data)
        return data


def real_requirements(name: str, version: str) -> list[str]:
    """Requires-Dist of PyPI's cp313 Linux x86_64 wheel of ``name==version`` (CUDA libraries left out)."""
    base = version.split("+")[0]
    index = urllib.request.urlopen(f"https://pypi.org/simple/{name}/", timeout=60).read().decode()
    wanted = re.compile(rf'href="([^"#]*/{name}-{re.escape(base)}-cp313-cp313-manylinux[^"#]*x86_64\.whl)')
    found = wanted.search(index)
    if found is None:
        raise RuntimeError(f"PyPI has no cp313 Linux x86_64 wheel of {name} {base} to read requirements from")
    with zipfile.ZipFile(_HttpFile(found.group(1))) as wheel:
        meta = next(m for m in wheel.namelist() if m.endswith(".dist-info/METADATA"))
        lines = wheel.read(meta).decode().splitlines()
    reqs = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    return [r for r in reqs if "extra ==" not in r and not canonical(r).startswith(("nvidia-", "cuda-"))]


def stand_in(folder: Path, name: str, version: str, requires: list[str]) -> None:
    """A metadata-only wheel of ``name==version`` with ``requires``."""
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    files = {f"{dist}/METADATA": "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n"
             + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: check_gpu_pins\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)


def pip_resolve(reqs: list[str], constraints: dict[str, str], links: Path) -> tuple[bool, str, dict[str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        cfile, report = Path(tmp) / "constraints.txt", Path(tmp) / "report.json"
        cfile.write_text("".join(f"{k}=={v}\n" for k, v in sorted(constraints.items())))
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--only-binary=:all:",
               "--python-version", PYTHON, "--target", str(Path(tmp) / "target"), "--find-links", str(links),
               "-c", str(cfile), "--disable-pip-version-check", "--report", str(report)]
        for plat in PLATFORMS:
            cmd += ["--platform", plat]
        proc = subprocess.run(cmd + reqs, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = (proc.stdout + proc.stderr).splitlines()
            return False, "\n".join(ln for ln in lines if not ln.startswith(("WARNING: Location", "Collecting",
                                                                                  "  Using cached", "  Downloading",
                                                                                  "Obtaining", "Requirement"))), {}
        chosen = {canonical(i["metadata"]["name"]): i["metadata"]["version"]
                  for i in json.loads(report.read_text())["install"]}
    return True, "", chosen


def check(extras: list[str]) -> dict:
    colab = colab_packages()
    reqs = requirements(extras)
    pinned = {canonical(r.split("==")[0]) for r in reqs if "==" in r}
    start = time.time()
    with tempfile.TemporaryDirectory() as links:
        for name in TRIO:
            stand_in(Path(links), name, colab[name], real_requirements(name, colab[name]))
        constraints = {k: v for k, v in colab.items() if k not in pinned}
        released: list[str] = []
        for _ in range(12):  # release the constraints a requirement conflicts with, a few at a time
            ok, err, chosen = pip_resolve(reqs, constraints, Path(links))
            if ok:
                break
            blamed = sorted({canonical(n) for n in re.findall(r"\(constraint\) ([A-Za-z0-9_.\-]+)", err)}
                            | {canonical(n) for n in re.findall(r"Cannot install ([A-Za-z0-9_.\-]+)==", err)})
            blamed = [b for b in blamed if b in constraints]
            if not blamed or any(b in TRIO for b in blamed):
                return {"resolved": False, "seconds": round(time.time() - start, 1), "extras": extras,
                        "released": released, "error": err.strip()[-3000:],
                        "torch_trio_kept": False if any(b in TRIO for b in blamed) else None}
            for b in blamed:
                constraints.pop(b)
            released += blamed
    changed = {k: [colab[k], v] for k, v in sorted(chosen.items()) if k in colab and colab[k] != v}
    added = {k: v for k, v in sorted(chosen.items()) if k not in colab}
    trio = {k: chosen.get(k, colab[k]) for k in TRIO}
    return {"resolved": True, "asked": time.strftime("%Y-%m-%d", time.gmtime()),  # the index changes: when asked
            "seconds": round(time.time() - start, 1), "python": PYTHON, "extras": extras,
            "image": "Colab GPU (dev/colab/pip-freeze.gpu.txt)", "released_constraints": released,
            "changed": changed, "added": added, "torch_trio": trio,
            "torch_trio_kept": all(trio[k] == colab[k] for k in TRIO),
            "ipywidgets_kept": chosen.get("ipywidgets", colab["ipywidgets"]) == colab["ipywidgets"],
            "versions": {k: chosen.get(k) for k in ("transformers", "trl", "peft", "datasets", "accelerate",
                                                     "bitsandbytes", "unsloth", "unsloth-zoo", "xformers",
                                                     "triton", "vllm", "numpy")}}


def main() -> int:
    extras = ["gpu"]
    if "--extras" in sys.argv:
        extras = sys.argv[sys.argv.index("--extras") + 1].split(",")
    sys.path.insert(0, str(ROOT))
    from bench.archive import stamped  # the command, commit, date and machine, as bench/measured/INDEX.md lists them

    result = stamped(check(extras))
    if "--report" in sys.argv:
        Path(sys.argv[sys.argv.index("--report") + 1]).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0 if result["resolved"] and result["torch_trio_kept"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
