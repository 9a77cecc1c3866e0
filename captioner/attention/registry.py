"""Build attention modules by name, so that the model can take its mapping from a config."""

from __future__ import annotations

import inspect

from torch import nn

from .entmax import Entmax, Entmax15
from .fusedmax import Fusedmax
from .oscarmax import Oscarmax
from .softmax import Softmax
from .sparsemax import Sparsemax
from .tvmax import TVMax

_CLASSES: dict[str, type[nn.Module]] = {
    "softmax": Softmax,
    "sparsemax": Sparsemax,
    "entmax15": Entmax15,
    "entmax": Entmax,
    "fusedmax": Fusedmax,
    "oscarmax": Oscarmax,
    "tvmax": TVMax,
}

MAPPINGS: tuple[str, ...] = tuple(_CLASSES)


def mapping_class(name: str) -> type[nn.Module]:
    """The module class registered under ``name`` (ValueError listing the valid names)."""
    if name not in _CLASSES:
        raise ValueError(
            f"unknown attention mapping {name!r}; valid names: {', '.join(MAPPINGS)}"
        )
    return _CLASSES[name]


def build(name: str, **kwargs) -> nn.Module:
    """Construct the attention module registered under ``name`` with ``kwargs``.

    Keywords: entmax takes ``alpha`` and ``learn_alpha``; fusedmax and oscarmax ``lam``;
    tvmax ``lam``, ``learn_lam``, ``solver`` and ``overlap``; the others none.

    >>> build("tvmax", lam=0.01, learn_lam=True)  # doctest: +SKIP

    Raises:
        ValueError: unknown ``name`` (the message lists :data:`MAPPINGS`) or a bad value.
        TypeError: a keyword the mapping does not take (the message lists those it takes).
    """
    cls = mapping_class(name)
    # nn.Module.__init__(*args, **kwargs) stands for "no keywords" in classes without their own
    accepted = [
        p.name
        for p in inspect.signature(cls).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(
            f"attention mapping {name!r} got unexpected keyword(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(accepted) or 'no keywords'}"
        )
    return cls(**kwargs)
