"""Parametrized cases split between `make test` and `make test-slow`."""

from __future__ import annotations

from collections.abc import Iterable

import pytest


def slow_after(cases: Iterable, keep: int = 1) -> list:
    """``cases`` (values for one argument, or tuples for several) with all but the first ``keep`` marked slow:
    `make test` checks the mechanism on those (it must stay under five minutes), `make test-slow` on every case."""
    return [case if i < keep else pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=pytest.mark.slow)
            for i, case in enumerate(cases)]
