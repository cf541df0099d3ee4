"""The study scripts of experiments/ as modules, for the tests of the studies that register
backbones of their own: each imported once per test module, its backbones taken off the
registry after, so no other test sees them (snens.models.available)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest

import snens.models

EXPERIMENTS = str(Path(__file__).resolve().parents[2] / "experiments")


def _experiment(name: str, backbones: Sequence[str]) -> Iterator[ModuleType]:
    sys.path.insert(0, EXPERIMENTS)
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(EXPERIMENTS)
        sys.modules.pop(name, None)
        for backbone in backbones:
            snens.models._BUILDERS.pop(backbone, None)


@pytest.fixture(scope="module")
def holdout() -> Iterator[ModuleType]:
    yield from _experiment("holdout", ("holdout_mlp", "holdout_gn_cnn"))


@pytest.fixture(scope="module")
def fresh() -> Iterator[ModuleType]:
    yield from _experiment("fresh", ("fresh_review_transformer", "fresh_convnext"))
