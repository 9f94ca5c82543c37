"""The wheels of the product layer (``ProductLayer``): ``rayito`` for the library's functions.

The recipe writer encodes the recipe with the product's own code at deploy (and the reconciler
starts VMs with it), so those functions need the ``rayito`` package and what it imports: grpcio
and protobuf (platform wheels) and the AWS SDK it was made for. The layer holds exactly the
versions this synth runs (the ones the tests ran), built for the functions' platform (Linux,
arm64, the functions' Python) with pip, without Docker:

* pip installs the wheels for that platform into a folder (``--platform``, ``--only-binary``,
  ``--no-deps`` with the pinned list), from ``RAYITO_CONSTRUCTS_WHEELHOUSE`` when it is set (a
  folder of wheels: offline), otherwise from the package index pip is configured with;
* the folder is zipped once (``python/`` at its root, byte for byte the same on every machine)
  and cached under ``RAYITO_CONSTRUCTS_CACHE`` (default ``~/.cache/rayito-constructs``), keyed by
  the pins and the platform; later synths copy nothing but the zip.

So a first synth on a machine without the cache reaches the package index once (about 26 MB of
wheels), unless a wheelhouse is given: ``rayito-constructs fetch-wheels DIR`` fills one (the
README, "What each command needs"), and builds the layer's zip there too, so that a synth with
that wheelhouse and an empty cache finds the zip made (building it is about 3 CPU-seconds of pip
and deflate; the zip is named by the same key, so a wheelhouse of other versions is never used).
``make synth`` fetches the wheels when it installs, so its synth is offline and its first synth
builds nothing.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

#: The product and what it imports at run time, in the versions installed with this library.
PACKAGES = ("rayito", "grpcio", "protobuf", "typing_extensions", "boto3", "botocore", "s3transfer", "jmespath",
            "python-dateutil", "six", "urllib3")
#: Bumped when the layer's layout changes (a new cache key for the same pins).
LAYOUT = "1"
WHEELHOUSE_ENV = "RAYITO_CONSTRUCTS_WHEELHOUSE"
CACHE_ENV = "RAYITO_CONSTRUCTS_CACHE"
_EPOCH = (2020, 1, 1, 0, 0, 0)


class LayerBuildError(ValueError):
    """The layer's wheels could not be had; ``str()`` is one line with what to do."""


@dataclass(frozen=True)
class Platform:
    """Where the layer's code runs: pip's ``--platform``/``--python-version``/``--abi`` values."""

    platforms: tuple[str, ...]
    python_version: str
    abi: str

    @property
    def tag(self) -> str:
        return f"cp{self.python_version.replace('.', '')}-{self.platforms[-1]}"

    def pip_args(self) -> list[str]:
        args = [arg for p in self.platforms for arg in ("--platform", p)]
        return [*args, "--python-version", self.python_version, "--implementation", "cp", "--abi", self.abi]


#: The library's functions: Python 3.14 on arm64 (``rayito_constructs._function``).
LAMBDA = Platform(("manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64"), "3.14", "cp314")


def host_platform() -> Platform:
    """This machine (Linux only): to run the functions' code with the layer in tests."""
    machine = os.uname().machine
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return Platform((f"manylinux2014_{machine}", f"manylinux_2_17_{machine}", f"manylinux_2_28_{machine}"),
                    version, f"cp{version.replace('.', '')}")


def pins() -> list[str]:
    """``name==version`` of every package of the layer, as installed here."""
    out = []
    for name in PACKAGES:
        try:
            out.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            raise LayerBuildError(f"the product layer needs {name} installed beside rayito_constructs "
                                  f"(pip install 'rayito-constructs'); it is not") from None
    return out


def cache_dir() -> Path:
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rayito-constructs")
    return Path(base)


def layer_key(platform: Platform = LAMBDA) -> str:
    text = "\n".join([LAYOUT, platform.tag, *platform.platforms, *pins()])
    return hashlib.sha256(text.encode()).hexdigest()


def layer_name(platform: Platform = LAMBDA) -> str:
    """The file name of the layer's zip, in the cache and in a wheelhouse: its key in it."""
    return f"product-{platform.tag}-{layer_key(platform)[:16]}.zip"


def layer_zip(platform: Platform = LAMBDA) -> Path:
    """The layer's zip for ``platform``: from the cache, from the wheelhouse (``fetch-wheels``
    built it there), or built once (see the module)."""
    name = layer_name(platform)
    target = cache_dir() / "layers" / name
    if target.is_file():
        return target
    wheelhouse = os.environ.get(WHEELHOUSE_ENV)
    if wheelhouse and (Path(wheelhouse) / name).is_file():
        return Path(wheelhouse) / name
    _build(target, platform)
    return target


def _build(target: Path, platform: Platform, *, wheelhouse: Optional[str] = None) -> None:
    """Install the layer's wheels into a temporary folder and zip it as ``target``, atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rayito-layer-", dir=target.parent) as work:
        folder = Path(work) / "layer"
        install(folder / "python", platform, wheelhouse=wheelhouse)
        partial = Path(work) / "layer.zip"
        _zip(folder, partial)
        os.replace(partial, target)


def layer_folder(platform: Platform) -> Path:
    """The layer unzipped (for tests that run a function's code with it, as Lambda does under
    ``/opt/python``): ``<cache>/layers/<name>/python``."""
    archive = layer_zip(platform)
    folder = cache_dir() / "layers" / archive.stem
    folder.parent.mkdir(parents=True, exist_ok=True)
    if not (folder / ".complete").is_file():
        partial = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(partial)
        (partial / ".complete").write_text(archive.name)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(partial, folder)
    return folder / "python"


def install(into: Path, platform: Platform, *, wheelhouse: Optional[str] = None) -> None:
    """pip-install the pinned wheels for ``platform`` into ``into``."""
    wheelhouse = wheelhouse if wheelhouse is not None else os.environ.get(WHEELHOUSE_ENV)
    source = ["--no-index", "--find-links", wheelhouse] if wheelhouse else []
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
               "--no-deps", "--only-binary=:all:", "--target", str(into), *platform.pip_args(), *source, *pins()]
    _pip(command, wheelhouse)


def fetch(dest: Path, platforms: Sequence[Platform] = (LAMBDA,)) -> None:
    """Download the layer's wheels for ``platforms`` into ``dest`` (a wheelhouse for offline
    synths), then build the functions' layer (``LAMBDA``) there from them, unless it is there."""
    dest.mkdir(parents=True, exist_ok=True)
    for platform in platforms:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                   "--only-binary=:all:", "--dest", str(dest), *platform.pip_args(), *pins()]
        _pip(command, None)
    if LAMBDA in platforms and not (dest / layer_name(LAMBDA)).is_file():
        _build(dest / layer_name(LAMBDA), LAMBDA, wheelhouse=str(dest))


def _pip(command: list[str], wheelhouse: Optional[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines()
                 if line.strip() and not line.startswith("WARNING: Location")]
        where = f"the wheelhouse {wheelhouse}" if wheelhouse else "the package index"
        raise LayerBuildError(
            f"the product layer (rayito for the library's Lambda functions) needs Linux wheels from {where}, and pip "
            f"could not get them ({lines[-1] if lines else f'exit {done.returncode}'}); with network, run "
            f"`rayito-constructs fetch-wheels DIR` and set {WHEELHOUSE_ENV}=DIR (docs/getting-started.md)")


def _zip(folder: Path, archive: Path) -> None:
    """A deterministic zip of ``folder``'s content: sorted names, fixed times and modes."""
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as out:
        for path in sorted(folder.rglob("*")):
            if path.is_dir() or path.suffix == ".pyc" or "__pycache__" in path.parts:
                continue
            info = zipfile.ZipInfo(path.relative_to(folder).as_posix(), date_time=_EPOCH)
            info.external_attr = (0o755 if os.access(path, os.X_OK) else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            out.writestr(info, path.read_bytes(), compresslevel=6)
