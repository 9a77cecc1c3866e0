"""The command line of ``captioner fit|validate|test`` as it was written: the order of its
options and ``--config`` files, and the keys each file sets. LightningCLI's parse result merges
them all; what is read here names the run after its first config, refuses an option that a
later config would replace, and names the config that set a model key a checkpoint keeps.

Plain files only, no Lightning: the command reads it before it builds its parser.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import yaml

from data_prep.settings_files import read_settings

# Model settings linked from the data's (add_arguments_to_parser): no config sets them itself.
LINKED_MODEL_KEYS = frozenset({"model.image_size", "model.vocab_size"})
# Data settings that a checkpoint's model keeps, by its hyperparameter: the images it was
# trained on were of that size, so a loaded model reads images (or a cache) of that size too.
KEPT_DATA_KEYS = {"data.image_size": "image_size"}


class GivenOption(NamedTuple):
    """An option of a command line: ``key`` dotted without ``--`` (``trainer.max_epochs``;
    ``config`` for every spelling of ``--config`` / ``-c``) and its value, if it has one."""

    key: str
    value: str | None


def given_options(args: list[str]) -> list[GivenOption]:
    """The options of ``args`` in order, as ``--key VALUE``, ``--key=VALUE`` or a flag, and
    ``-c FILE``, ``-c=FILE`` or ``-cFILE`` for ``--config FILE``."""
    found = []
    for index, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        following = args[index + 1] if index + 1 < len(args) else None
        if following is not None and following.startswith("-"):
            following = None
        if name in ("--config", "-c"):
            found.append(GivenOption("config", value if equals else following))
        elif arg.startswith("-c") and not arg.startswith("--"):
            found.append(GivenOption("config", arg[2:]))
        elif arg.startswith("--"):
            found.append(GivenOption(name[2:], value if equals else following))
    return found


def config_keys(config: str) -> list[str]:
    """The dotted keys that a ``--config`` (a file, with the files it includes, or a YAML
    string) sets, in its order; none when it cannot be read (the parse of the whole command
    line says why)."""
    path = Path(config)
    try:
        if path.is_file():
            return _flat_keys(read_settings(path, "config"), "", path.parent)
        return _flat_keys(yaml.safe_load(config), "", Path.cwd())
    except (OSError, ValueError, yaml.YAMLError):
        return []


def _flat_keys(document, prefix: str, folder: Path) -> list[str]:
    """The dotted keys of the settings ``document`` under ``prefix``, with a group given as
    the name of a file (``data: base/coco_data.yaml``) or by a ``config: FILE`` key read
    from ``folder``, as jsonargparse includes them."""
    if isinstance(document, str) and document.endswith((".yaml", ".yml")) and (
            prefix or document):
        included = folder / document
        if included.is_file():
            return _flat_keys(read_settings(included, "config"), prefix, included.parent)
    if isinstance(document, dict) and not document:
        return []
    if not isinstance(document, dict):
        return [prefix.rstrip(".")] if prefix else []
    keys = []
    for key, value in document.items():
        if key == "config" and isinstance(value, str):
            keys += _flat_keys(value, prefix, folder)  # an include, not a key
        else:
            keys += _flat_keys(value, f"{prefix}{key}.", folder)
    return keys


def option_a_config_replaces(args: list[str]) -> str | None:
    """The command line is applied in order: a ``--config`` file that sets a key replaces an
    option of that key given before it (``--ckpt_path last`` before a run's config.yaml,
    which holds ``ckpt_path: null``, would train a new run from scratch;
    ``--trainer.max_epochs 2`` before a paper config, 50 epochs). The refusal of such an
    option, in one line; None when there is none."""
    seen: list[str] = []
    for option in given_options(args):
        if option.key != "config":
            seen.append(option.key)
            continue
        keys = config_keys(option.value or "")
        for earlier in seen:
            # The shorter of the two: a key of a dict setting (model.output_attention_kwargs)
            # is the setting.
            key = next((min(key, earlier, key=len) for key in keys if earlier == key
                        or earlier.startswith(f"{key}.") or key.startswith(f"{earlier}.")), None)
            if key is not None:
                return (f"--{earlier} comes before --config {option.value}, which sets {key} "
                        "and would replace it; give the --config files first, then the options "
                        "that change them")
    return None


def model_keys_given(args: list[str]) -> dict[str, str | None]:
    """The ``model.*`` keys (and the data keys a model keeps, ``KEPT_DATA_KEYS``) that the
    command line ``args`` or its config files set, each with the ``--config FILE`` that set
    it last (None: the command line), in parsing order. The defaults are not among them:
    those yield to a checkpoint's values."""
    def kept_by_the_model(key: str) -> bool:
        return (key.startswith("model.") and key not in LINKED_MODEL_KEYS
                or key in KEPT_DATA_KEYS)

    given: dict[str, str | None] = {}
    for option in given_options(args):
        if option.key == "config":
            given.update({key: f"--config {option.value}" for key in config_keys(
                option.value or "") if kept_by_the_model(key)})
        elif kept_by_the_model(option.key):
            given[option.key] = None
    return given


def config_files(args: list[str]) -> list[str]:
    """The values of the ``--config`` / ``-c`` options of ``args``, in order."""
    return [option.value for option in given_options(args)
            if option.key == "config" and option.value is not None]


def option_values(args: list[str], key: str) -> list[str]:
    """The values that ``args`` gives the option ``--key``, in order."""
    return [option.value for option in given_options(args)
            if option.key == key and option.value is not None]


def first_config(args: list[str]) -> str | None:
    """The first ``--config`` / ``-c`` option of ``args`` that names a file (not a YAML
    string, which names no run)."""
    return next((config for config in config_files(args) if Path(config).is_file()), None)
