"""Statistics for tests of sampled output: the chi-square quantile."""

from __future__ import annotations

import math


def chi2_quantile(dof: int, tail: float) -> float:
    """Upper `tail` quantile of chi-square with `dof` degrees of freedom (Wilson-Hilferty)."""
    z = normal_upper_quantile(tail)
    h = 2 / (9 * dof)
    return dof * (1 - h + z * math.sqrt(h)) ** 3


def normal_upper_quantile(tail: float) -> float:
    low, high = 0.0, 10.0
    for _ in range(100):
        mid = (low + high) / 2
        if 0.5 * math.erfc(mid / math.sqrt(2)) > tail:
            low = mid
        else:
            high = mid
    return low
