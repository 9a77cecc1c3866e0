"""Decoding options: the one place of their defaults (no torch import, so that the commands'
``--help`` stays fast). Used by :mod:`captioner.model.decoding` and every captioning command."""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, make_dataclass, replace

from data_prep.settings_files import check_integers

# Exponent a of the beam ranking score log_prob / n ** a: a mild preference for longer
# captions, in the range commonly used for neural generation (Wu et al. 2016 use 0.6-0.7).
DEFAULT_LENGTH_NORMALIZATION = 0.7


def check_length_normalization(value: object, name: str = "length_normalization") -> None:
    """ValueError, naming ``name``, unless ``value`` is a finite number >= 0 (a bool is not
    one): the exponent a of the beam ranking score log_prob / n ** a."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class DecodingOptions:
    """How captions are decoded, in validation, test and every captioning command: the one
    place of these defaults (a model's own options are ``model.decoding`` of its config and
    are stored in its checkpoints; the commands' options override them, see
    :data:`DecodingOverrides`).

    Attributes:
        beam_size: beams per image (1: greedy search).
        max_length: most words per caption (end token excluded).
        length_normalization: exponent a of the beam ranking score log_prob / n ** a.
        block_trigrams: never repeat a trigram within a caption.
        allow_unk: let <unk> be generated (by default it never is: a caption with <unk>
            would reach the metrics and the raters).
    """

    beam_size: int = 3
    max_length: int = 20
    length_normalization: float = DEFAULT_LENGTH_NORMALIZATION
    block_trigrams: bool = False
    allow_unk: bool = False

    def __post_init__(self) -> None:
        check_integers([("decoding beam_size", self.beam_size, 1),
                        ("decoding max_length", self.max_length, 1)])
        check_length_normalization(self.length_normalization, "decoding length_normalization")
        for name in ("block_trigrams", "allow_unk"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"decoding {name} must be true or false, got {getattr(self, name)!r}"
                )

    @classmethod
    def coerce(cls, value: DecodingOptions | Mapping | None) -> DecodingOptions:
        """``value`` itself, the defaults for None, or the options of a dict (unknown keys are
        refused by name)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"decoding options must be a dict, got {type(value).__name__}")
        known = {field.name for field in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"unknown decoding option(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        return cls(**value)


def _overrides_class() -> type:
    """A frozen dataclass with each field of :class:`DecodingOptions`, optional and None by
    default: the options a command line or config gives, each of which, when given, replaces
    that of the model (see :func:`apply_overrides`). Derived from the fields, so that a new
    decoding option reaches every command."""
    types = typing.get_type_hints(DecodingOptions)
    overrides = make_dataclass(
        "DecodingOverrides",
        [(option.name, types[option.name] | None, field(default=None))
         for option in fields(DecodingOptions)],
        frozen=True)
    overrides.__module__ = __name__  # where jsonargparse and pickle look it up
    attributes = inspect.cleandoc(DecodingOptions.__doc__ or "").partition("Attributes:")[2]
    overrides.__doc__ = ("Decoding options, each defaulting to the checkpoint's own "
                         f"(model.decoding of its config).\n\nAttributes:{attributes}")
    return overrides


DecodingOverrides = _overrides_class()


def apply_overrides(options: DecodingOptions, overrides: object | None) -> DecodingOptions:
    """``options`` with each option that ``overrides`` (a :data:`DecodingOverrides`) gives.

    Raises:
        ValueError: an option out of range (named).
    """
    given = {option.name: getattr(overrides, option.name) for option in fields(DecodingOptions)
             if getattr(overrides, option.name, None) is not None}
    return replace(options, **given)
