"""The package's architecture, checked: data flows one way (data_prep -> captioner -> eval),
``captioner.attention`` stands alone (the import-linter contracts of ``pyproject.toml``), and
no module imports a private name of the libraries it builds on, whose next release may change
it without notice."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("captioner", "data_prep", "eval")
LIBRARIES = ("lightning", "pytorch_lightning", "jsonargparse", "torch", "torchvision")


def test_import_contracts_hold(capsys, monkeypatch):
    from importlinter.cli import lint_imports

    monkeypatch.chdir(ROOT)
    code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    told = capsys.readouterr().out
    assert code == 0, told[-3000:]
    assert "2 kept, 0 broken" in told


def _private_imports(source: str) -> list[str]:
    """``module.name`` of each import in ``source`` that reaches a private name (a module or
    attribute starting with ``_``) of one of :data:`LIBRARIES`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            modules, names = [alias.name for alias in node.names], []
        else:
            continue
        for module in modules:
            if module.split(".")[0] not in LIBRARIES:
                continue
            parts = module.split(".") + names
            if any(part.startswith("_") for part in parts):
                found.append(".".join(module.split(".") + [n for n in names if n.startswith("_")]))
    return found


@pytest.mark.parametrize("source, expected", [
    ("from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector",
     ["lightning.pytorch.trainer.connectors.signal_connector._SignalConnector"]),
    ("from jsonargparse._link_arguments import skip_apply_links",
     ["jsonargparse._link_arguments"]),
    ("import torch._dynamo", ["torch._dynamo"]),
    ("from torch import nn\nimport numpy._core\nfrom ._checks import x", []),
])
def test_the_private_import_check_sees_them(source, expected):
    assert _private_imports(source) == expected


def test_no_private_import_of_the_libraries():
    found = {
        str(path.relative_to(ROOT)): names
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if (names := _private_imports(path.read_text(encoding="utf-8")))
    }
    assert found == {}
