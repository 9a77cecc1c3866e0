"""The inverse of softplus, which turns a learned parameter's starting value into its raw one.

Learned strengths are kept positive as softplus(raw): TVmax's lam = softplus(raw) and
alpha-entmax's alpha = 1 + softplus(raw)."""

from __future__ import annotations

import math


def inverse_softplus(y: float) -> float:
    """The x > -inf with softplus(x) = log(1 + e^x) = y, for y > 0: y + log(1 - e^-y), which
    stays finite and accurate for large y (log(expm1(y)) overflows from y = 710)."""
    return y + math.log(-math.expm1(-y))
