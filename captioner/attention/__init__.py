"""Attention mappings: scores -> probability weights, dense, sparse or structured.

Functional API (``z`` scores, ``mask`` bool with True = may attend):

* :func:`softmax`, :func:`sparsemax` (Martins & Astudillo, 2016)

Every mapping validates its input (ValueError on NaN, ``+inf`` or fully masked rows).
Modules share ``forward(scores (..., H, W), mask=None) -> weights (..., H, W)``;
:func:`build` constructs them by name (:data:`MAPPINGS`).
"""

from .registry import MAPPINGS, build
from .softmax import Softmax, softmax
from .sparsemax import Sparsemax, sparsemax

__all__ = [
    "MAPPINGS",
    "Softmax",
    "Sparsemax",
    "build",
    "softmax",
    "sparsemax",
]
