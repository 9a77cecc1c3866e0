"""Attention mappings: scores -> probability weights, dense, sparse or structured.

Functional API (``z`` scores, ``mask`` bool with True = may attend):

* :func:`softmax`, :func:`sparsemax` (Martins & Astudillo, 2016)
* :func:`entmax15` (exact) and :func:`entmax_bisect` (any alpha > 1, differentiable in
  alpha) (Peters et al., 2019; Correia et al., 2019)
* :func:`fusedmax` and :func:`oscarmax` (Niculae & Blondel, 2017), built on the exact
  proximal operators :func:`tv1d_prox` (Condat, 2013) and :func:`oscar_prox`
* :func:`tvmax` and its prox :func:`tv2d_prox` over (..., H, W) grids (Martins et al.)

Every mapping validates its input (ValueError on NaN, ``+inf`` or fully masked rows); inside
a :class:`DeferredChecks` the checks of GPU tensors are read back once, not at every call.
Modules share ``forward(scores (..., H, W), mask=None) -> weights (..., H, W)``;
:func:`build` constructs them by name (:data:`MAPPINGS`). A module that can solve in a
background thread (:class:`TVMax`) also has ``starts_in_background(device) -> bool`` and
``start(scores) -> Callable[[], weights]``.
"""

from ._checks import DeferredChecks, fail_if
from .entmax import Entmax, Entmax15, entmax15, entmax_bisect
from .fusedmax import Fusedmax, fusedmax
from .oscarmax import Oscarmax, oscar_prox, oscarmax
from .registry import MAPPINGS, build
from .softmax import Softmax, softmax
from .sparsemax import Sparsemax, sparsemax
from .tv1d import tv1d_prox
from .tvmax import TVMax, tv2d_prox, tvmax

__all__ = [
    "MAPPINGS",
    "DeferredChecks",
    "Entmax",
    "Entmax15",
    "Fusedmax",
    "Oscarmax",
    "Softmax",
    "Sparsemax",
    "TVMax",
    "build",
    "entmax15",
    "entmax_bisect",
    "fail_if",
    "fusedmax",
    "oscar_prox",
    "oscarmax",
    "softmax",
    "sparsemax",
    "tv1d_prox",
    "tv2d_prox",
    "tvmax",
]
