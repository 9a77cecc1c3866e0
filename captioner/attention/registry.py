"""Build attention modules by name, so that the model can take its mapping from a config."""

from __future__ import annotations

import importlib
import inspect

from torch import nn

# name -> (module, class); imported on demand so that the registry stays importable while
# a mapping's module is absent or broken, and the error names the mapping asked for.
_CLASSES = {
    "softmax": (".softmax", "Softmax"),
    "sparsemax": (".sparsemax", "Sparsemax"),
    "entmax15": (".entmax", "Entmax15"),
    "entmax": (".entmax", "Entmax"),
    "fusedmax": (".fusedmax", "Fusedmax"),
    "oscarmax": (".oscarmax", "Oscarmax"),
    "tvmax": (".tvmax", "TVMax"),
}

MAPPINGS: tuple[str, ...] = tuple(_CLASSES)


def mapping_class(name: str) -> type[nn.Module]:
    """The module class registered under ``name`` (ValueError listing the valid names)."""
    if name not in _CLASSES:
        raise ValueError(
            f"unknown attention mapping {name!r}; valid names: {', '.join(MAPPINGS)}"
        )
    module, cls = _CLASSES[name]
    return getattr(importlib.import_module(module, __package__), cls)


def build(name: str, **kwargs) -> nn.Module:
    """Construct the attention module registered under ``name`` with ``kwargs``.

    >>> build("entmax", alpha=1.3, learn_alpha=True)  # doctest: +SKIP

    Raises:
        ValueError: unknown ``name`` (the message lists :data:`MAPPINGS`) or a bad value.
        TypeError: a keyword the mapping does not take (the message lists those it takes).
    """
    cls = mapping_class(name)
    accepted = list(inspect.signature(cls).parameters)
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(
            f"attention mapping {name!r} got unexpected keyword(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(accepted) or 'no keywords'}"
        )
    return cls(**kwargs)
