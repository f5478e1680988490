"""A slim wheelhouse for the lent GPU machine: the course's GPU stack as wheels it installs offline (issue 36).

    python dev/wheelhouse.py lock     # resolve the pins for the machine (needs PyPI) -> dev/wheelhouse.lock.json
    python dev/wheelhouse.py build    # download the locked wheels, slim, repack, verify (needs PyPI) -> .cache/gpu-carry/
    python dev/wheelhouse.py verify   # check a built folder again (offline)
    python dev/wheelhouse.py plan     # the file list the lock gives and what slimming drops (offline)

The lent machine (docs/gpu-check.md) has Python 3.12, torch 2.11.0+cu130, transformers 5.17.0 and the packages
of ``dev/gpu_image.txt``, reaches no package index, and a call carries at most 64 MiB (the working tree plus the
carried folders). ``lock`` asks pip (``--dry-run --report``: binary wheels for CPython 3.12 on manylinux x86-64)
to resolve ``[project.dependencies]`` plus the ``gpu`` extra of pyproject.toml with every image package stood in
by a metadata-only wheel, so nothing the image has is carried:

* an image package of known version stands in as ``X+image``, pinned, so pip never takes PyPI's release of it;
* one whose version is unknown stands in as ``9999+image``, not pinned: pip takes it (it meets every lower bound)
  unless a requirement caps the package (``fsspec<=2026.2.0`` for datasets) or the course pins it
  (``peft==0.21.2``); then pip takes a real release, which is carried (the lock says why);
* :data:`DROPPED` packages stand in too and are never carried (each with its reason);
* :data:`PROTECTED` packages (torch, transformers, ...) are never carried: a requirement their image versions do
  not meet stops the lock.

``build`` downloads the carried wheels, checks their sha256 against the lock, drops what the machine cannot use
(:data:`SLIM`: other CUDA versions' libraries of bitsandbytes, Unsloth's ``studio/`` web app) and repacks each
changed wheel with a new RECORD, copies the bundled model's tokenizer for the check's tiny models, and verifies the
folder: every RECORD matches its files, the set installs with ``pip install --no-index --no-deps --target`` into an
empty folder (torch and transformers untouched), its requirements resolve offline against the wheelhouse plus the
image's stand-ins, and the folder plus the working tree fits the 64 MiB a call carries (sizes printed).
"""

from __future__ import annotations

import argparse
import base64
import csv
import fnmatch
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.parse
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
IMAGE_FILE = ROOT / "dev" / "gpu_image.txt"
LOCK_FILE = ROOT / "dev" / "wheelhouse.lock.json"
OUT = ROOT / ".cache" / "gpu-carry"          # ignored (.cache/): carried to the machine as one folder
DOWNLOADS = ROOT / ".cache" / "wheelhouse-downloads"   # the wheels as published, kept for rebuilds
MIB = 1024 * 1024
LIMIT = 64 * MIB                              # what one device call carries: working tree + carried paths
PYTHON = "3.12"
PYTHON_FULL = "3.12.3"
MANYLINUX = (17, 24, 27, 28, 31, 34, 35)
PLATFORMS = ["manylinux1_x86_64", "manylinux2014_x86_64"] + [f"manylinux_2_{n}_x86_64" for n in MANYLINUX]
CUDA = "130"                                  # torch 2.11.0+cu130: bitsandbytes loads libbitsandbytes_cuda130.so
UNKNOWN = "9999+image"                        # the stand-in version of an image package whose version is unknown
DROPPED_VERSION = "9999+dropped"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json")

#: Never carried: the image's own builds, made for its CUDA. A requirement they miss stops the lock.
PROTECTED = ("torch", "torchvision", "torchaudio", "triton", "transformers")

#: Required by a carried package's metadata but never carried, with the reason (checked in unsloth 2026.10.3).
DROPPED: dict[str, str] = {
    "xformers": "each xformers wheel is built for one torch release (not the image's 2.11.0+cu130); Unsloth imports "
                "it inside try/except and uses PyTorch's SDPA without it (unsloth/models/_utils.py, the "
                "`from xformers import __version__` block)",
    "diffusers": "required by unsloth 2026.10.3's metadata but imported only by its studio/ web app, which the "
                 "wheelhouse drops (no `import diffusers` in unsloth/, unsloth_zoo/ or unsloth_cli/)",
}


@dataclass(frozen=True)
class SlimRule:
    """Members of one package's wheel that the machine cannot use: dropped, the wheel repacked."""

    drop: tuple[str, ...]          # fnmatch patterns of archive paths
    keep: tuple[str, ...] = ()     # patterns kept even when a drop pattern matches
    why: str = ""


SLIM: dict[str, SlimRule] = {
    "bitsandbytes": SlimRule(
        drop=("bitsandbytes/libbitsandbytes_*.so",),
        keep=(f"bitsandbytes/libbitsandbytes_cuda{CUDA}.so", "bitsandbytes/libbitsandbytes_cpu.so"),
        why=f"one native library per CUDA/ROCm/XPU version; the image's torch is CUDA {CUDA[:-1]}.{CUDA[-1]}, so "
            f"only libbitsandbytes_cuda{CUDA}.so (and the CPU one) can load there"),
    "unsloth": SlimRule(
        drop=("studio/*",),
        why="studio/ is Unsloth's bundled web app (a top-level package of its own); the course imports unsloth "
            "and unsloth_zoo only"),
}


class WheelhouseError(RuntimeError):
    """The wheelhouse cannot be locked, built or verified; the message says what to do."""


# ----------------------------------------------------------------------------------------------------- inputs
def pins(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The requirements the machine needs: ``[project.dependencies]`` plus the ``gpu`` extra."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"]["gpu"])


def image_packages(path: Path = IMAGE_FILE) -> dict[str, str | None]:
    """``{canonical name: version or None}`` of the machine's image (``dev/gpu_image.txt``).

    Example:
        >>> image_packages()["torch"], image_packages()["pandas"]
        ('2.11.0+cu130', None)
    """
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = version.strip() or None
    return out


def machine_environment() -> dict[str, str]:
    """PEP 508 marker values of the machine (CPython 3.12 on Linux x86-64), to read requirements as it would."""
    env = dict(default_environment())
    env.update(python_version=PYTHON, python_full_version=PYTHON_FULL, implementation_name="cpython",
               platform_python_implementation="CPython", sys_platform="linux", platform_system="Linux",
               platform_machine="x86_64", os_name="posix", implementation_version=PYTHON_FULL)
    return env


def applies(req: Requirement, extras: Iterable[str] = ()) -> bool:
    """Whether a requirement applies on the machine (its marker, with the package's requested extras)."""
    if req.marker is None:
        return True
    env = machine_environment()
    return any(req.marker.evaluate(dict(env, extra=e)) for e in ("", *extras))


# --------------------------------------------------------------------------------------------------- pip
def platform_flags() -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp"]
    for plat in PLATFORMS:
        flags += ["--platform", plat]
    return flags


def pip_env() -> dict[str, str]:
    """This machine's environment without its extra find-links folder (only the index and our folders count)."""
    return {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_NO_INDEX")}


def pip(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=pip_env(), timeout=timeout)


def stand_in(folder: Path, name: str, version: str) -> Path:
    """A metadata-only wheel of ``name==version`` (no requirements, no files): what the image or a drop provides."""
    base = f"{name.replace('-', '_')}-{version}"
    files = {f"{base}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{base}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: dev/wheelhouse.py\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-any\n"}
    files[f"{base}.dist-info/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{base}.dist-info/RECORD,,\n"
    path = folder / f"{base}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for member, text in files.items():
            whl.writestr(member, text)
    return path


def stand_ins(folder: Path, image: dict[str, str | None]) -> dict[str, str]:
    """Write the stand-ins of the image's packages and of the drops into ``folder``; return the constraints that
    pin the image's known versions and the drops (``{name: version}``).

    A known version stands in as ``X+image``, pinned, so pip never takes PyPI's release of the same number. An
    unknown version stands in as ``9999+image``, not pinned: pip takes it unless a requirement caps the package
    (``fsspec<=2026.2.0``), and then takes a real release, which the wheelhouse carries."""
    pinned = {}
    for name, version in image.items():
        local = version if version is None or "+" in version else f"{version}+image"  # torch's has a label already
        stand_in(folder, name, local or UNKNOWN)
        if local:
            pinned[name] = local
    for name in DROPPED:
        stand_in(folder, name, DROPPED_VERSION)
        pinned[name] = DROPPED_VERSION
    return pinned


def resolve(requirements: list[str], constraints: dict[str, str], links: Iterable[Path],
            index: bool = True) -> tuple[bool, str, list[dict]]:
    """pip's dry-run resolution for the machine: ``(ok, error text, the report's install list)``."""
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        cfile, report = Path(tmp) / "constraints.txt", Path(tmp) / "report.json"
        cfile.write_text("".join(f"{n}=={v}\n" for n, v in sorted(constraints.items())))
        args = ["install", "--dry-run", "--ignore-installed", "--report", str(report),
                "--target", str(Path(tmp) / "target"), "-c", str(cfile), *platform_flags()]
        if not index:
            args.append("--no-index")
        for link in links:
            args += ["--find-links", str(link)]
        proc = pip(*args, *requirements)
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if not ln.startswith("WARNING: Location")]
            return False, "\n".join(ln for ln in lines if not ln.lstrip().startswith(
                ("Collecting", "Using cached", "Downloading", "Processing", "Obtaining", "Looking in", "━"))), []
        return True, "", json.loads(report.read_text())["install"]


def from_folder(item: dict, folder: Path) -> bool:
    """Whether pip's report took ``item`` from ``folder`` (a stand-in, or the built wheelhouse)."""
    url = item["download_info"]["url"]
    return url.startswith("file:") and Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)).parent == folder


# -------------------------------------------------------------------------------------------------- lock
def lock(write: bool = True) -> dict[str, Any]:
    """Resolve the pins for the machine and write ``dev/wheelhouse.lock.json`` (needs PyPI)."""
    roots, image = pins(), image_packages()
    for text in roots:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name in PROTECTED and not (image[name] and req.specifier.contains(image[name], prereleases=True)):
            raise WheelhouseError(f"pyproject.toml asks for {text}, but the GPU machine's image has {name} "
                                  f"{image[name] or '(version unknown)'}, which the wheelhouse must not replace.")
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="standins-") as tmp:
        links = Path(tmp).resolve()
        constraints = stand_ins(links, image)
        ok, error, install = resolve(roots, constraints, [links])
    if not ok:
        raise WheelhouseError(
            f"The pins do not resolve for the GPU machine (Python {PYTHON}, manylinux x86-64, the image of "
            f"dev/gpu_image.txt). pip said:\n{error[-3000:]}\nChange the pins in pyproject.toml (or "
            "dev/gpu_image.txt if the image changed) and run `python dev/wheelhouse.py lock` again.")
    resolved = {canonicalize_name(i["metadata"]["name"]): i for i in install}
    packages = []
    for name, item in sorted(resolved.items()):
        meta = item["metadata"]
        entry: dict[str, Any] = {"name": name, "version": meta["version"]}
        if name in DROPPED:
            entry.update(role="dropped", why=DROPPED[name])
        elif from_folder(item, links):
            entry.update(role="image", version=image[name] or "unknown")
        else:
            info = item["download_info"]
            entry.update(role="carry", file=info["url"].rsplit("/", 1)[-1],
                         sha256=info.get("archive_info", {}).get("hashes", {}).get("sha256"),
                         requires=list(meta.get("requires_dist", [])),
                         requested_extras=sorted(item.get("requested_extras") or []))
            if name in image:
                asks = [f"{other} {r}" for other, o in resolved.items() for r in o["metadata"].get("requires_dist", [])
                        if canonicalize_name(Requirement(r).name) == name and applies(Requirement(r))]
                asks += [f"pyproject.toml {r}" for r in roots if canonicalize_name(Requirement(r).name) == name]
                entry["why"] = ("also on the image (version " + (image[name] or "unknown") + "), carried at the "
                                "version these allow: " + "; ".join(asks))
        packages.append(entry)
    packages.sort(key=lambda p: (p["role"], p["name"]))
    result = {"made_by": "python dev/wheelhouse.py lock", "date": time.strftime("%Y-%m-%d"),
              "seconds": round(time.time() - start, 1), "python": PYTHON, "platforms": PLATFORMS,
              "image": str(IMAGE_FILE.relative_to(ROOT)), "pins": roots, "packages": packages}
    if write:
        LOCK_FILE.write_text(json.dumps(result, indent=1) + "\n")
    return result


def read_lock(path: Path = LOCK_FILE) -> dict[str, Any]:
    if not path.is_file():
        raise WheelhouseError(f"No lock at {path}: run `python dev/wheelhouse.py lock` (needs PyPI).")
    return json.loads(path.read_text())


def stale_pins(lock_data: dict[str, Any]) -> list[str]:
    """Pins of pyproject.toml the lock was not made from (and locked pins pyproject no longer has)."""
    now, then = set(pins()), set(lock_data["pins"])
    return sorted(f"+{p}" for p in now - then) + sorted(f"-{p}" for p in then - now)


def carried(lock_data: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in lock_data["packages"] if p["role"] == "carry"]


# ------------------------------------------------------------------------------------------------- checks
def unmet_requirements(lock_data: dict[str, Any], image: dict[str, str | None] | None = None) -> list[str]:
    """Requirements of carried packages that neither the wheelhouse, the image nor a drop meets (offline).

    An image package of unknown version meets a requirement unless the requirement caps it (``<``, ``<=``, ``==``,
    ``~=``, ``!=`` on it): those the lock carries instead. Returns ``"package: requirement (why)"`` lines."""
    image = image_packages() if image is None else image
    have = {p["name"]: p["version"] for p in carried(lock_data)}
    problems = []
    for pkg in carried(lock_data):
        for text in pkg["requires"]:
            req = Requirement(text)
            name = canonicalize_name(req.name)
            if not applies(req, pkg.get("requested_extras", ())) or name in DROPPED:
                continue
            if name in have:
                if not req.specifier.contains(have[name], prereleases=True):
                    problems.append(f"{pkg['name']}: {text} (the wheelhouse has {have[name]})")
            elif name in image:
                version = image[name]
                if version is not None and not req.specifier.contains(Version(version).public, prereleases=True):
                    problems.append(f"{pkg['name']}: {text} (the image has {version})")
                if version is None and any(s.operator in ("<", "<=", "==", "===", "~=", "!=") for s in req.specifier):
                    problems.append(f"{pkg['name']}: {text} (capped, and the image's version is unknown)")
            else:
                problems.append(f"{pkg['name']}: {text} (neither carried nor on the image)")
    return problems


def machine_tags() -> set[Tag]:
    """The wheel tags pip accepts on the machine: CPython 3.12 on manylinux x86-64 (up to glibc 2.35)."""
    return set(cpython_tags((3, 12), abis=["cp312"], platforms=PLATFORMS)) | set(
        compatible_tags((3, 12), interpreter="cp312", platforms=PLATFORMS))


def wheel_fits_machine(filename: str) -> bool:
    """True when a wheel installs on the machine.

    Example:
        >>> wheel_fits_machine("multiprocess-0.70.19-py312-none-any.whl"), wheel_fits_machine("x-1-cp313-cp313-any.whl")
        (True, False)
    """
    return bool(parse_wheel_filename(filename)[3] & machine_tags())


# --------------------------------------------------------------------------------------------------- slim
def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def dist_info(names: Iterable[str]) -> str:
    found = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    if len(found) != 1:
        raise WheelhouseError(f"a wheel needs exactly one .dist-info folder, found {sorted(found)}")
    return found.pop()


def slim_members(package: str, names: Iterable[str]) -> list[str]:
    """The archive paths of ``package``'s wheel that :data:`SLIM` drops.

    Example:
        >>> slim_members("bitsandbytes", ["bitsandbytes/libbitsandbytes_cuda118.so",
        ...                               f"bitsandbytes/libbitsandbytes_cuda{CUDA}.so", "bitsandbytes/nn/modules.py"])
        ['bitsandbytes/libbitsandbytes_cuda118.so']
    """
    rule = SLIM.get(canonicalize_name(package))
    if rule is None:
        return []
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in rule.drop)
            and not any(fnmatch.fnmatchcase(n, p) for p in rule.keep)]


def repack(src: Path, dst: Path, drop: Iterable[str]) -> dict[str, Any]:
    """Copy a wheel without the ``drop`` members, its RECORD rewritten (and ``top_level.txt`` without dropped
    top-level folders); ``{"dropped_files", "dropped_bytes"}``."""
    drop = set(drop)
    with zipfile.ZipFile(src) as zin:
        infos = zin.infolist()
        info_dir = dist_info(i.filename for i in infos)
        record_name = f"{info_dir}/RECORD"
        kept = [i for i in infos if i.filename not in drop and i.filename != record_name and not i.is_dir()]
        gone_tops = {n.split("/", 1)[0] for n in drop if "/" in n} - {i.filename.split("/", 1)[0] for i in kept}
        rows = []
        tmp = dst.with_suffix(".part")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for info in kept:
                data = zin.read(info)
                if info.filename == f"{info_dir}/top_level.txt" and gone_tops:
                    data = "".join(f"{line}\n" for line in data.decode().splitlines()
                                   if line.strip() not in gone_tops).encode()
                new = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                new.external_attr, new.compress_type = info.external_attr, zipfile.ZIP_DEFLATED
                zout.writestr(new, data)
                rows.append((info.filename, record_hash(data), str(len(data))))
            buf = io.StringIO()
            writer = csv.writer(buf, lineterminator="\n")
            writer.writerows(rows + [(record_name, "", "")])
            zout.writestr(zipfile.ZipInfo(record_name, date_time=(2026, 1, 1, 0, 0, 0)), buf.getvalue())
        os.replace(tmp, dst)
        dropped = [i for i in infos if i.filename in drop]
    return {"dropped_files": len(dropped), "dropped_bytes": sum(i.file_size for i in dropped)}


def check_record(path: Path) -> list[str]:
    """What is wrong with a wheel's RECORD (a file missing from it, listed but absent, or a wrong hash or size)."""
    problems = []
    with zipfile.ZipFile(path) as whl:
        names = [i.filename for i in whl.infolist() if not i.is_dir()]
        info_dir = dist_info(names)
        rows = list(csv.reader(io.StringIO(whl.read(f"{info_dir}/RECORD").decode())))
        listed = {row[0]: row for row in rows if row}
        for name in names:
            if name not in listed:
                problems.append(f"{path.name}: {name} is not in RECORD")
        for name, row in listed.items():
            if name.endswith(".dist-info/RECORD") or name.endswith(".dist-info/RECORD.jws"):
                continue
            if name not in names:
                problems.append(f"{path.name}: RECORD lists {name}, which the wheel lacks")
                continue
            data = whl.read(name)
            if row[1] != record_hash(data) or (row[2] and int(row[2]) != len(data)):
                problems.append(f"{path.name}: {name} does not match its RECORD hash or size")
    return problems


# -------------------------------------------------------------------------------------------------- build
def plan(lock_data: dict[str, Any]) -> list[dict[str, Any]]:
    """The wheelhouse's file list from the lock: one row per carried wheel, with the slimming rule that applies."""
    rows = []
    for pkg in carried(lock_data):
        rule = SLIM.get(pkg["name"])
        rows.append({"name": pkg["name"], "version": pkg["version"], "file": pkg["file"], "sha256": pkg["sha256"],
                     "slim": {"drop": list(rule.drop), "keep": list(rule.keep), "why": rule.why} if rule else None})
    return rows


def download(rows: list[dict[str, Any]], folder: Path) -> dict[str, Path]:
    """The locked wheels in ``folder`` (downloaded once, sha256 checked): ``{name: path}``."""
    folder.mkdir(parents=True, exist_ok=True)
    missing = [r for r in rows if not (folder / r["file"]).is_file()]
    if missing:
        proc = pip("download", "--no-deps", "--quiet", "-d", str(folder), *platform_flags(),
                   *[f"{r['name']}=={r['version']}" for r in missing])
        if proc.returncode != 0:
            raise WheelhouseError(f"pip could not download the locked wheels (needs PyPI):\n{proc.stderr[-2000:]}")
    out = {}
    for row in rows:
        path = folder / row["file"]
        if not path.is_file():
            raise WheelhouseError(f"pip downloaded no {row['file']}; run `python dev/wheelhouse.py lock` again.")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if row["sha256"] and digest != row["sha256"]:
            path.unlink()
            raise WheelhouseError(f"{row['file']}: sha256 {digest} is not the locked {row['sha256']} (deleted; "
                                  "run build again, or lock again if the index changed the file)")
        out[row["name"]] = path
    return out


def tokenizer_source() -> Path:
    """The bundled model's folder (``make setup`` builds it), whose tokenizer the check's tiny models use."""
    sys.path.insert(0, str(ROOT))
    from helpers.models import bundled_model_path
    return bundled_model_path(build=False)


def build(out: Path = OUT, downloads: Path = DOWNLOADS) -> dict[str, Any]:
    """Download, slim, repack and verify the wheelhouse into ``out`` (``out/wheels``, ``out/tokenizer``)."""
    lock_data = read_lock()
    if stale := stale_pins(lock_data):
        raise WheelhouseError(f"dev/wheelhouse.lock.json was made from other pins ({', '.join(stale)}): run "
                              "`python dev/wheelhouse.py lock` (needs PyPI), then build again.")
    rows = plan(lock_data)
    sources = download(rows, downloads)
    if out.exists():
        shutil.rmtree(out)
    (out / "wheels").mkdir(parents=True)
    wheels = []
    for row in rows:
        src = sources[row["name"]]
        with zipfile.ZipFile(src) as whl:
            drop = slim_members(row["name"], [i.filename for i in whl.infolist()])
        dst = out / "wheels" / src.name
        if drop:
            slimmed = repack(src, dst, drop)
        else:
            shutil.copy2(src, dst)
            slimmed = {"dropped_files": 0, "dropped_bytes": 0}
        wheels.append({"name": row["name"], "version": row["version"], "file": dst.name,
                       "published_bytes": src.stat().st_size, "bytes": dst.stat().st_size,
                       "sha256": hashlib.sha256(dst.read_bytes()).hexdigest(), **slimmed})
    tok_dir = out / "tokenizer"
    tok_dir.mkdir()
    source = tokenizer_source()
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, tok_dir / name)
    manifest = {"made_by": "python dev/wheelhouse.py build", "date": time.strftime("%Y-%m-%d %H:%M"),
                "lock": str(LOCK_FILE.relative_to(ROOT)), "python": PYTHON, "cuda": CUDA,
                "tokenizer_from": str(source), "wheels": wheels,
                "image_requirements": image_requirements(lock_data),
                "dropped": {p["name"]: p["why"] for p in lock_data["packages"] if p["role"] == "dropped"}}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return verify(out)


def image_requirements(lock_data: dict[str, Any]) -> dict[str, list[str]]:
    """``{image package: [requirement (by whom)]}``: what carried packages ask of the image, for the machine to check."""
    image = image_packages()
    have = {p["name"] for p in carried(lock_data)}
    out: dict[str, list[str]] = {}
    for pkg in carried(lock_data):
        for text in pkg["requires"]:
            req = Requirement(text)
            name = canonicalize_name(req.name)
            if applies(req, pkg.get("requested_extras", ())) and name in image and name not in have:
                out.setdefault(name, []).append(f"{req.name}{req.specifier} ({pkg['name']})")
    return dict(sorted(out.items()))


# ------------------------------------------------------------------------------------------------- verify
def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of what a device call sends besides carried paths: tracked and untracked-not-ignored files."""
    proc = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          capture_output=True, check=True)
    files = {f for f in proc.stdout.decode().split("\0") if f}
    return sum((root / f).stat().st_size for f in files if (root / f).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def verify(out: Path = OUT) -> dict[str, Any]:
    """Check a built folder offline; prints the sizes and returns (and writes) ``out/verify.json``."""
    manifest = json.loads((out / "manifest.json").read_text())
    lock_data = read_lock()
    wheels = sorted((out / "wheels").glob("*.whl"))
    problems = [p for w in wheels for p in check_record(w)]
    names = [canonicalize_name(parse_wheel_filename(w.name)[0]) for w in wheels]
    problems += [f"{n}: more than one wheel" for n in sorted({n for n in names if names.count(n) > 1})]
    problems += [f"{w.name}: does not install on CPython {PYTHON} manylinux x86-64" for w in wheels
                 if not wheel_fits_machine(w.name)]
    problems += [f"{n}: carried, but the image's own build must stay" for n in names if n in PROTECTED]
    expected = {p["name"]: p["version"] for p in carried(lock_data)}
    got = {canonicalize_name(parse_wheel_filename(w.name)[0]): str(parse_wheel_filename(w.name)[1]) for w in wheels}
    problems += [f"{n}: the lock has {v}, the folder {got.get(n)}" for n, v in expected.items() if got.get(n) != v]
    with tempfile.TemporaryDirectory(prefix="wheelhouse-verify-") as tmp:
        target = Path(tmp) / "site"
        start = time.time()
        proc = pip("install", "--no-index", "--no-deps", "--no-compile", "--quiet", "--target", str(target),
                   *platform_flags(), *map(str, wheels))
        install_seconds = round(time.time() - start, 1)
        if proc.returncode != 0:
            problems.append(f"pip install --no-index --no-deps --target failed:\n{proc.stderr[-2000:]}")
        installed = sorted(canonicalize_name(p.name.split("-")[0]) for p in target.glob("*.dist-info"))
        problems += [f"{n}: installed into the target, would shadow the image's own build" for n in installed
                     if n in PROTECTED]
        tops = sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info")) if target.exists() else []
        problems += ["studio/ is still in the install"] if "studio" in tops else []
        bnb_libs = sorted(p.name for p in (target / "bitsandbytes").glob("libbitsandbytes_*.so"))
        links = (Path(tmp) / "links").resolve()
        links.mkdir()
        constraints = {**stand_ins(links, image_packages()), **expected}
        ok, error, install = resolve(pins(), constraints, [out / "wheels", links], index=False)
        if not ok:
            problems.append(f"the pins do not resolve offline from the wheelhouse and the image:\n{error[-2000:]}")
        from_wheelhouse = sorted(canonicalize_name(i["metadata"]["name"]) for i in install
                                 if from_folder(i, (out / "wheels").resolve()))
    problems += [f"{n}: carried but nothing requires it" for n in sorted(set(expected) - set(from_wheelhouse))] \
        if ok else []
    sizes = {"wheels": folder_bytes(out / "wheels"), "tokenizer": folder_bytes(out / "tokenizer"),
             "manifest": (out / "manifest.json").stat().st_size, "working_tree": tree_bytes()}
    total = sum(sizes.values())
    problems += [f"the call would carry {total / MIB:.1f} MiB, over the {LIMIT / MIB:.0f} MiB limit"] \
        if total > LIMIT else []
    result = {"ok": not problems, "problems": problems, "folder": str(out), "wheels": len(wheels),
              "published_mib": round(sum(w["published_bytes"] for w in manifest["wheels"]) / MIB, 2),
              "sizes_mib": {k: round(v / MIB, 2) for k, v in sizes.items()},
              "total_mib": round(total / MIB, 2), "limit_mib": LIMIT // MIB,
              "headroom_mib": round((LIMIT - total) / MIB, 2), "target_install_seconds": install_seconds,
              "installed_top_level": tops, "bitsandbytes_libraries": bnb_libs,
              "offline_resolution": "ok" if ok else "failed"}
    (out / "verify.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def print_sizes(result: dict[str, Any], manifest: dict[str, Any]) -> None:
    print(f"{'wheel':60s} {'published':>10s} {'carried':>9s}")
    for w in sorted(manifest["wheels"], key=lambda w: -w["bytes"]):
        print(f"{w['file'][:60]:60s} {w['published_bytes'] / MIB:9.2f}M {w['bytes'] / MIB:8.2f}M")
    s = result["sizes_mib"]
    print(f"wheels {s['wheels']} MiB (published {result['published_mib']} MiB) + tokenizer {s['tokenizer']} MiB "
          f"+ working tree {s['working_tree']} MiB = {result['total_mib']} MiB of {result['limit_mib']} MiB "
          f"({result['headroom_mib']} MiB to spare)")
    print("verified" if result["ok"] else "PROBLEMS:\n  " + "\n  ".join(result["problems"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["lock", "build", "verify", "plan"])
    parser.add_argument("--out", type=Path, default=OUT, help=f"the wheelhouse folder (default {OUT})")
    args = parser.parse_args(argv)
    try:
        if args.command == "lock":
            data = lock()
            roles = {r: sum(p["role"] == r for p in data["packages"]) for r in ("carry", "image", "dropped")}
            print(f"wrote {LOCK_FILE.relative_to(ROOT)}: {roles} in {data['seconds']} s")
            for line in unmet_requirements(data):
                print("unmet:", line)
            return 0
        if args.command == "plan":
            data = read_lock()
            if stale := stale_pins(data):
                print(f"the lock is stale ({', '.join(stale)}): run `python dev/wheelhouse.py lock`")
                return 1
            for row in plan(data):
                print(f"{row['file']}" + (f"   slim: drop {row['slim']['drop']} keep {row['slim']['keep']}"
                                          if row["slim"] else ""))
            return 0
        result = build(args.out) if args.command == "build" else verify(args.out)
        print_sizes(result, json.loads((args.out / "manifest.json").read_text()))
        return 0 if result["ok"] else 1
    except WheelhouseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
