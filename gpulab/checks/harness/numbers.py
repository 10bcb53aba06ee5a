"""A learner's numbers, read and compared: one definition of each tolerance helper.

    as_number(DOMINANT_SHARE, "DOMINANT_SHARE")   a real, finite number, or a message saying why not
    rel_err(got, want)                            largest |got - want| over the largest |want|
"""

from __future__ import annotations

import math

import numpy as np


def as_number(value, name: str) -> float:
    """A learner's numeric answer as a float; AssertionError when it is not a real number."""
    if isinstance(value, bool | str | bytes) or not isinstance(
            value, int | float | np.integer | np.floating):
        raise AssertionError(
            f"{name} should be a number (an int or a float), but it is {value!r}. Assign the "
            f"value itself, e.g. `{name} = 3`.")
    number = float(value)
    if not np.isfinite(number):
        raise AssertionError(f"{name} is {number}; it should be a finite number.")
    return number


def rel_err(got, want) -> float:
    """Largest |got - want| over the largest |want|, for lists of tensors compared in float64 (inf
    where got holds NaN)."""
    top = max(float(w.abs().max()) for w in want)
    diffs = [float((g.double() - w.double()).abs().max()) for g, w in zip(got, want, strict=True)]
    if any(math.isnan(d) for d in diffs):
        return math.inf
    return max(diffs) / top if top > 0 else (0.0 if max(diffs) == 0 else math.inf)
