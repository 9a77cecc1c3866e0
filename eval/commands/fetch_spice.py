"""``captioner fetch-spice``: install the jars SPICE needs on Java 17 (see eval.metrics.spice_jars).

Options may come from a YAML file (--config FILE; --print_config writes one)."""

from __future__ import annotations

from captioner.commands.options import FunctionParser, arguments_of, function_parser
from eval.metrics.spice_jars import install_spice

HELP = "download and verify the Stanford CoreNLP and Nashorn jars that SPICE needs"


def build_parser() -> FunctionParser:
    return function_parser("captioner fetch-spice", __doc__, install_spice)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return install_spice(**arguments_of(install_spice, args))
