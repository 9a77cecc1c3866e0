"""What the commands share: their parser, their report of a user error, and the decoding
options of the commands that caption with a checkpoint (caption, heatmaps, gallery,
rating-kit, evaluate).

A command is a jsonargparse parser over a library function (:func:`function_parser`): its
options are the function's parameters, their help the function's docstring, and every command
takes ``--config FILE`` and ``--print_config`` as ``fit`` does. :class:`FunctionParser` reads
the command line: options spelled with dashes (``--beam-size``) as with underscores, an option
given twice refused, a usage error one line; :meth:`FunctionParser.check` and
:meth:`FunctionParser.check_option` make the ValueError of a check of options that are each
valid but do not go together a usage error too.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import re
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path

import docstring_parser
import jsonargparse
import yaml
from jsonargparse import ActionConfigFile, ActionYesNo

from captioner.reporting import close_progress_bars


def _plain(doc: str) -> str:
    """``doc`` without its reStructuredText markup."""
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc).replace("`", "")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, jsonargparse.DefaultHelpFormatter):
    """jsonargparse's help, with the description's layout (a command's docstring) kept."""


def _yaml_or_text(load: Callable[..., object]) -> Callable[..., object]:
    """jsonargparse's YAML loader ``load`` of a command-line value, taking a value that is not
    UTF-8 (a file name of other bytes, which reaches Python as surrogate escapes, as ls shows
    it) as the text it is: YAML reads UTF-8 only, and the name would be refused."""

    @functools.wraps(load)  # its parameters, which jsonargparse reads
    def load_value(value: str, *args, **kwargs) -> object:
        try:
            return load(value, *args, **kwargs)
        except UnicodeEncodeError:
            return value

    load_value.reads_any_text = True
    return load_value


if not getattr(jsonargparse.get_loader("yaml"), "reads_any_text", False):
    # The same loader, and the same errors of a config file that is not YAML.
    jsonargparse.set_loader("yaml", _yaml_or_text(jsonargparse.get_loader("yaml")),
                            exceptions=(yaml.YAMLError,))


class FunctionParser(jsonargparse.ArgumentParser):
    """A jsonargparse parser whose :meth:`parse_args` takes long options spelled with dashes
    (``--no-progress``) as with underscores, as the commands were spelled before they were
    jsonargparse's; refuses a second value of an option in ``once``, where the last value
    would silently hold (``--ckpt A --ckpt B`` meant both, or A), while other options keep
    the last value (an override of a default or of a --config); and reports a usage error in
    one line, ``prog: error: message``, with SystemExit(2): jsonargparse's spans several,
    after the whole usage. An option in ``appended`` (a list) takes one value each time it is
    given (``--ckpt A --ckpt B``), as jsonargparse's ``--ckpt+ A`` does."""

    def __init__(self, *args, once: Sequence[str] = (), appended: Sequence[str] = (),
                 **kwargs) -> None:
        super().__init__(*args, exit_on_error=False, **kwargs)
        self.once = tuple(once)
        self.appended = tuple(appended)

    def parse_args(self, args: Sequence[str] | None = None, *pos, **kwargs
                   ) -> jsonargparse.Namespace:
        argv = _appending(_underscored(sys.argv[1:] if args is None else args), self.appended)
        try:
            _refuse_repeats(argv, self.once)
            return super().parse_args(argv, *pos, **kwargs)
        except (argparse.ArgumentError, jsonargparse.ArgumentError) as exc:
            message = one_line_usage_error(str(exc))
            if message.startswith("Problems parsing config"):  # a --config file's, unnamed
                files = [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--config"]
                files += [word.partition("=")[2] for word in argv
                          if word.startswith("--config=")]
                message = f"--config {' '.join(files)}: {message}"
            self.usage_error(message)

    def check(self, check: Callable[..., None], *args) -> None:
        """``check(*args)``, whose ValueError is a usage error: options that are each valid
        but do not go together."""
        try:
            check(*args)
        except ValueError as exc:
            self.usage_error(str(exc))

    def check_option(self, name: str, check: Callable[[object], object], value: object) -> None:
        """``check(value)`` for option ``--name``, an argparse ``type`` or a reader such as
        :func:`data_prep.wording.names`, whose error is a usage error, worded as argparse words
        it."""
        try:
            check(value)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            self.usage_error(f"argument --{name}: {exc}")

    def usage_error(self, message: str) -> typing.NoReturn:
        """``prog: error: message`` on stderr, and SystemExit(2)."""
        close_progress_bars()
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def one_line_usage_error(message: str) -> str:
    """jsonargparse's message of a value its type refuses, which lists every type of a union
    tried, on several lines, as one line: ``--NAME: invalid value V (expected T or null)``, or
    ``(expected one of A, B)`` for a choice of values (a Literal);
    any other message folded onto one line."""
    key = re.match(r'Parser key "([^"]+)":', message)
    given = re.search(r"(?:Given|Got) value: (.*)$", message, re.MULTILINE)
    if key is None or given is None:
        return " ".join(message.split())
    # Each type of a union tried: a class, or a Literal's values (a choice, as {a,b} in help).
    tried = re.findall(r"Expected a (?:<class '(\w+)'>|typing\.Literal\[([^\]]*)\])", message)
    expected: dict[str, None] = {}
    for kind, choices in tried:
        expected.update(dict.fromkeys([c.strip(" '") for c in choices.split(",")] if choices
                                      else [kind]))
    kinds = [kind for kind in expected if kind != "NoneType"]
    if "NoneType" in expected:
        kinds.append("null")
    if len(kinds) > 1 and any(choices for _, choices in tried):
        kinds = ["one of " + ", ".join(kinds)]
    return (f"--{key[1]}: invalid value {given[1]}"
            + (f" (expected {' or '.join(kinds)})" if kinds else ""))


def function_parser(prog: str, doc: str, function: Callable, *, skip: Sequence[str] = (),
                    once: Sequence[str] = ()) -> FunctionParser:
    """The parser of command ``prog``: ``doc`` (its module docstring) as the description,
    ``--config FILE`` and ``--print_config``, and an option per parameter of ``function``
    but those in ``skip``, its help from the function's docstring. A bool parameter is a flag,
    ``--NAME`` / ``--no_NAME``; a list parameter is given once per value (``--ckpt A --ckpt
    B``). Positionals are added by the command. ``once``: see :class:`FunctionParser`."""
    types = typing.get_type_hints(function)
    lists = [name for name, kind in types.items()
             if name not in skip and typing.get_origin(kind) is list]
    parser = FunctionParser(prog=prog, description=_plain(doc), formatter_class=_HelpFormatter,
                            once=once, appended=lists)
    parser.add_argument("--config", action=ActionConfigFile,
                        help="YAML file of options, as --print_config writes it; options "
                             "after it override its values")
    flags = _bool_parameters(function, skip)
    parser.add_function_arguments(function, None, skip={*skip, *flags}, as_group=False)
    _add_flags(parser, function, flags)
    return parser


def _bool_parameters(target: Callable, skip: Sequence[str] = ()) -> list[str]:
    """The parameters of function or class ``target`` typed bool (or bool | None)."""
    types = typing.get_type_hints(target.__init__ if isinstance(target, type) else target)
    return [name for name, kind in types.items()
            if name not in skip and kind in (bool, bool | None)]


def _add_flags(parser: jsonargparse.ArgumentParser, target: Callable, names: list[str]) -> None:
    """Each parameter of ``target`` in ``names`` as a flag, ``--NAME`` / ``--no_NAME``
    (jsonargparse's own bool options take a value: ``--NAME true``), its help from the
    docstring of ``target``."""
    described = {param.arg_name: param.description
                 for param in docstring_parser.parse(target.__doc__ or "").params}
    defaults = {name: param.default
                for name, param in inspect.signature(target).parameters.items()}
    for name in names:
        parser.add_argument(f"--{name}", action=ActionYesNo, default=defaults[name],
                            help=described.get(name))


def add_image_inputs(parser: FunctionParser, *, nargs: str = "+",
                     help: str = "image files and folders of images") -> None:
    """The positional ``IMAGE_OR_DIR`` arguments of the commands that caption image files
    (caption, heatmaps, gallery), as ``inputs``: folders are searched recursively
    (:func:`captioner.inference.image_files.collect_images`)."""
    parser.add_argument("inputs", nargs=nargs, type=_given_path, metavar="IMAGE_OR_DIR",
                        help=help)


class _GivenPath:
    """A path named on the command line. An empty one, most often an unset shell variable,
    is refused: as a Path it would be the current folder, and every image below it would be
    captioned."""

    def __call__(self, text: str) -> Path:
        if not text:
            raise argparse.ArgumentTypeError(
                "an empty path (an unset shell variable?); give '.' for this folder")
        return Path(text)

    def __repr__(self) -> str:
        return "Path"  # as the help names the argument's type


_given_path = _GivenPath()


def add_options_of(parser: jsonargparse.ArgumentParser, options: type) -> None:
    """The fields of the dataclass ``options`` (:data:`DecodingOverrides`, a figure style) as
    options of their own names (``--beam_size``), their help from its docstring, a bool field
    a flag; :func:`options_of` collects them. The command's function takes them as one
    parameter, which its parser skips."""
    flags = _bool_parameters(options)
    parser.add_class_arguments(options, None, skip=set(flags))
    _add_flags(parser, options, flags)


def options_of(args: jsonargparse.Namespace, options: type):
    """The ``options`` dataclass (see :func:`add_options_of`) that ``args`` give."""
    return options(**{option.name: args.get(option.name) for option in fields(options)})


def arguments_of(function: Callable, args: jsonargparse.Namespace) -> dict:
    """The values of ``args`` that are parameters of ``function``, by name."""
    return {name: args[name] for name in inspect.signature(function).parameters if name in args}


def _underscored(argv: Sequence[str]) -> list[str]:
    """``argv`` with each long option's name spelled with underscores, as jsonargparse names
    the parameters (``--beam-size=3`` -> ``--beam_size=3``); values and what follows ``--``
    are kept as given."""
    spelled = []
    for index, token in enumerate(argv):
        if token == "--":
            return spelled + list(argv[index:])
        if token.startswith("--"):
            name, equals, value = token.partition("=")
            token = "--" + name[2:].replace("-", "_") + equals + value
        spelled.append(token)
    return spelled


def _appending(argv: list[str], appended: Sequence[str]) -> list[str]:
    """``argv`` with each option of ``appended`` spelled as jsonargparse appends a value to a
    list: ``--ckpt A`` -> ``--ckpt+ A``."""
    spelled = []
    for index, token in enumerate(argv):
        if token == "--":
            return spelled + argv[index:]
        name, equals, value = token.partition("=")
        spelled.append(f"{name}+{equals}{value}" if name[2:] in appended else token)
    return spelled


def _refuse_repeats(argv: list[str], once: Sequence[str]) -> None:
    """argparse.ArgumentError for an option of ``once`` given twice."""
    given: dict[str, str] = {}
    for index, token in enumerate(argv):
        if token == "--":
            return
        if not token.startswith("--"):
            continue
        name, equals, value = token.partition("=")
        if not equals:
            if index + 1 == len(argv) or argv[index + 1].startswith("--"):
                continue  # a flag
            value = argv[index + 1]
        if name[2:] not in once:
            continue
        if name in given:
            raise argparse.ArgumentError(None, f"{name} is given twice ({given[name]} and "
                                               f"{value}); give it once")
        given[name] = value


def any_float(text: str) -> float:
    """An argparse ``type``: ``float(text)``, nan and inf included (jsonargparse's float type,
    which reads YAML, takes neither), for a command that checks the values itself and names
    them."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
