"""The product layer's zip (rayito_constructs/wheels.py): a synth takes it from the cache, else
from the wheelhouse where ``fetch-wheels`` built it, and builds it only when neither has it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayito_constructs import wheels


def test_a_synth_takes_the_layer_fetch_wheels_built_in_the_wheelhouse(tmp_path: Path, monkeypatch) -> None:
    wheelhouse, cache = tmp_path / "wheels", tmp_path / "cache"
    wheelhouse.mkdir()
    built = wheelhouse / wheels.layer_name(wheels.LAMBDA)
    built.write_bytes(b"zip")
    monkeypatch.setenv(wheels.WHEELHOUSE_ENV, str(wheelhouse))
    monkeypatch.setenv(wheels.CACHE_ENV, str(cache))
    monkeypatch.setattr(wheels, "_build", lambda *a, **k: pytest.fail("built although the wheelhouse has it"))
    assert wheels.layer_zip(wheels.LAMBDA) == built
    assert not cache.exists()  # nothing copied, nothing built


def test_the_cache_comes_first_and_another_key_is_never_taken(tmp_path: Path, monkeypatch) -> None:
    wheelhouse, cache = tmp_path / "wheels", tmp_path / "cache"
    (cache / "layers").mkdir(parents=True)
    wheelhouse.mkdir()
    name = wheels.layer_name(wheels.LAMBDA)
    assert name.startswith(f"product-{wheels.LAMBDA.tag}-") and wheels.layer_key(wheels.LAMBDA)[:16] in name
    (wheelhouse / name.replace(wheels.layer_key(wheels.LAMBDA)[:16], "0" * 16)).write_bytes(b"other pins")
    monkeypatch.setenv(wheels.WHEELHOUSE_ENV, str(wheelhouse))
    monkeypatch.setenv(wheels.CACHE_ENV, str(cache))
    made: list[Path] = []
    monkeypatch.setattr(wheels, "_build", lambda target, platform, **k: (made.append(target), target.write_bytes(b"z")))
    assert wheels.layer_zip(wheels.LAMBDA) == cache / "layers" / name and made == [cache / "layers" / name]
    (wheelhouse / name).write_bytes(b"fetched")
    assert wheels.layer_zip(wheels.LAMBDA) == cache / "layers" / name  # the cache's, already made


def test_fetch_wheels_builds_the_layer_once_from_what_it_downloaded(tmp_path: Path, monkeypatch) -> None:
    commands: list[list[str]] = []
    monkeypatch.setattr(wheels, "_pip", lambda command, wheelhouse: commands.append(command))
    built: list[tuple[Path, object]] = []
    monkeypatch.setattr(wheels, "_build", lambda target, platform, wheelhouse=None: (
        built.append((target, wheelhouse)), target.write_bytes(b"z")))
    wheels.fetch(tmp_path)
    wheels.fetch(tmp_path)
    assert [c[3] for c in commands] == ["download", "download"]
    assert built == [(tmp_path / wheels.layer_name(wheels.LAMBDA), str(tmp_path))]
