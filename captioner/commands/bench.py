"""``captioner bench {attention,model,fit}``: benchmarks that print time ratios side by side."""

from __future__ import annotations

import importlib
import sys

HELP = ("benchmarks: 'bench attention' (mappings), 'bench model' (training step, beam search) or "
        "'bench fit' (a real fit on COCO-shaped data); 'bench page' regenerates the tables of "
        "docs/benchmarks.md")

_TARGETS = {
    "attention": "captioner.benchmarks.attention",
    "model": "captioner.benchmarks.model",
    "fit": "captioner.benchmarks.fit",
    "page": "captioner.benchmarks.page",
}


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
    return int(importlib.import_module(_TARGETS[argv[0]]).main(argv[1:]) or 0)
