"""A pipeline call's options, each declared once (``Option``) on its pipeline's class, by which the pipeline checks a
call's and ``bertkit serve`` its parameters. Loads no torch: the server's wire reads it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bertkit.errors import BertkitError, is_whole

# The test a value passes, and the words saying what it must be.
Rule = tuple[Callable[[Any], bool], str]
# A rule, or a function of the pipeline (None where it is not loaded yet) giving one, for a bound it sets.
Declared = Rule | Callable[[Any], Rule | None] | None

BOOL: Rule = (lambda v: isinstance(v, bool), "true or false")
FINITE: Rule = (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
                "a finite number")


def int_in(lo: int, hi: float = math.inf, why: str = "") -> Rule:
    """A whole number in [lo, hi] (a bool is no int)."""
    words = f"an int of at least {lo}" if hi == math.inf else f"an int in [{lo}, {hi}]"
    return (lambda v: is_whole(v, lo, hi)), words + why


def or_none(rule: Rule) -> Rule:
    """``rule``, or None for the option's default (a JSON null is dropped before the wire checks it)."""
    ok, words = rule
    return (lambda v: v is None or ok(v)), words


def checked_flag(name: str, value: Any, unset: str) -> bool | None:
    """A pipeline's on/off setting as True, False or None (``unset`` says what None means); a string such as "no" or
    "false", or a number, is refused rather than read by its truthiness (``normalize="no"`` scaled every vector to
    length 1, ``progress="no"`` drew the bar). numpy's bool (from a config or an array) is a bool."""
    if value is None or isinstance(value, bool):
        return value
    import numpy as np  # here, not above: `bertkit --help` reads this module and loads no numpy

    if isinstance(value, np.bool_):
        return bool(value)
    raise BertkitError(f"{name} must be True, False or None ({unset}), got {value!r}")


def refusal(name: str, value: Any, rule: Rule | None) -> str | None:
    """Why ``value`` of option ``name`` is refused by ``rule``, or None when it passes."""
    if rule is None or rule[0](value):
        return None
    return f"{name} must be {rule[1]}, got {repr(value)[:80]}"


@dataclass(frozen=True)
class Option:
    """One keyword of a pipeline's call (``Pipeline.call_options``). ``rule`` is what the pipeline refuses, checked
    before any input is read (None: nothing, or where the pipeline reads it); ``served`` what ``bertkit serve`` refuses
    where that differs (an option it leaves out, TEI's reading of one, a range of its own), else ``rule``. ``wire`` is
    the Inference API's name where it differs (serve takes that one), ``help`` what answers that name here, for the
    pipeline's refusal of it."""

    name: str
    rule: Declared = None
    wire: str = ""
    help: str = ""
    served: Declared = None

    def check(self, pipe: Any, served: bool = False) -> Rule | None:
        """The rule for ``pipe`` (None: not loaded yet), or for its server."""
        declared = self.served if served and self.served is not None else self.rule
        return declared(pipe) if callable(declared) else declared
