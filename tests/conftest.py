"""Shared fixtures: where the real checkpoint and the shared data live, and clear skips when absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BERTKIT_DATA", REPO.parent / "shared" / "data"))


def model_dir() -> Path:
    return Path(os.environ.get("BERTKIT_TEST_MODEL", REPO / "models" / "minilm")).resolve()


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    d = model_dir()
    if not (d / "config.json").is_file():
        pytest.skip(f"real checkpoint absent at {d}: run `make model` (bertkit download-example-model {d})")
    return d


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA.is_dir():
        pytest.skip(f"shared data absent at {DATA}: these checks need ../shared/data beside the repo")
    return DATA
