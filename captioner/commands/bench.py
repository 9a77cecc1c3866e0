"""``captioner bench {attention,model,fit,page}``: benchmarks that print time ratios side by
side. Each benchmark's options are the parameters of its module's ``benchmark`` function
(:mod:`captioner.benchmarks`), and may come from a YAML file (--config FILE; --print_config
writes one)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from captioner.commands.options import FunctionParser, arguments_of, function_parser

HELP = ("benchmarks: 'bench attention' (mappings), 'bench model' (training step, beam search) or "
        "'bench fit' (a real fit on COCO-shaped data); 'bench page' regenerates the tables of "
        "docs/benchmarks.md")

_TARGETS = {
    "attention": "captioner.benchmarks.attention",
    "model": "captioner.benchmarks.model",
    "fit": "captioner.benchmarks.fit",
    "page": "captioner.benchmarks.page",
}


def build_parser(benchmark: str) -> FunctionParser:
    """The parser of ``captioner bench BENCHMARK``: its module's docstring as the
    description, an option per parameter of its ``benchmark``; the page is a positional."""
    module = importlib.import_module(_TARGETS[benchmark])
    parser = function_parser(f"captioner bench {benchmark}", module.__doc__, module.benchmark,
                             skip=("page", "run"))
    if benchmark == "page":
        parser.add_argument("page", type=Path, help="the markdown page, e.g. docs/benchmarks.md")
    return parser


def run_benchmark(benchmark: str, argv: list[str]) -> int:
    """Parse ``argv`` as the options of ``benchmark``, refuse any it cannot run (one line,
    status 2) and run it."""
    module = importlib.import_module(_TARGETS[benchmark])
    parser = build_parser(benchmark)
    options = arguments_of(module.benchmark, parser.parse_args(argv))
    parser.check(lambda: module.check_options(**options))
    page_runner = {"run": run_block} if benchmark == "page" else {}
    return int(module.benchmark(**options, **page_runner) or 0)


def run_block(block, markdown: Path) -> int:
    """Run a generated block of ``bench page`` (a :class:`captioner.benchmarks.page.Block`) in
    this process, writing its table to ``markdown``."""
    print(f"running: {block.command}", file=sys.stderr, flush=True)
    return run_benchmark(block.benchmark, [*block.argv, "--markdown", str(markdown)])


def main(argv: list[str]) -> int:
    usage = f"usage: captioner bench {{{','.join(_TARGETS)}}} [--help]"
    if argv and argv[0] in ("-h", "--help"):
        lines = [f"  {name:<10} {importlib.import_module(target).HELP}"
                 for name, target in _TARGETS.items()]
        print("\n".join([usage, "", *lines, "", "captioner bench NAME --help: its options"]))
        return 0
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    if argv[0] not in _TARGETS:
        print(f"captioner bench: unknown benchmark {argv[0]!r}; expected one of "
              f"{', '.join(_TARGETS)}", file=sys.stderr)
        return 2
    return run_benchmark(argv[0], argv[1:])
