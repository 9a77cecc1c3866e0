"""The package's architecture, checked: data flows one way (data_prep -> captioner -> eval),
inside ``captioner`` each role imports only those below it (commands -> benchmarks ->
inference -> training -> features -> model -> attention), ``captioner.attention`` stands alone
(the import-linter contracts of ``pyproject.toml``), no library module imports a command
module (a command parses its options and calls the library), and no module imports a private
name of the libraries it builds on, or defines one over theirs in a subclass (a private method
of LightningCLI): their next release may change it without notice."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
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
    assert "3 kept, 0 broken" in told


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


COMMAND_PACKAGES = ("captioner.commands", "eval.commands")


def _command_imports(source: str) -> list[str]:
    """The modules of :data:`COMMAND_PACKAGES` that ``source`` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        found += [module for module in modules
                  if any(module == package or module.startswith(package + ".")
                         for package in COMMAND_PACKAGES)]
    return found


def test_the_command_import_check_sees_them():
    source = ("from captioner.commands.options import names\nimport eval.commands.score\n"
              "from captioner.command import x\nfrom eval.commandsx import y\n")
    assert _command_imports(source) == ["captioner.commands.options", "eval.commands.score"]


def test_no_library_module_imports_a_command_module():
    found = {
        str(path.relative_to(ROOT)): modules
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.parent.name != "commands"
        and (modules := _command_imports(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_an_upward_import_between_captioner_roles_breaks_a_contract(tmp_path):
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with (tmp_path / "captioner" / "model" / "devices.py").open("a") as handle:
        handle.write("\nfrom captioner.training import module  # noqa: E402\n")
    command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    done = subprocess.run([sys.executable, "-c", command, "--no-cache"], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "captioner's roles, each importing only those below it BROKEN" in done.stdout
    assert "captioner.model.devices -> captioner.training.module" in done.stdout


# Private names that a metaclass puts in every class it makes (abc.ABCMeta, torch's Function).
_MADE_BY_METACLASSES = frozenset({"_abc_impl", "_backward_cls"})


def _private_overrides(cls: type) -> list[str]:
    """``Class.name`` of each private name (one leading ``_``) that ``cls`` defines over a
    base class of one of :data:`LIBRARIES`: a private method or attribute of theirs replaced."""
    found = []
    for base in cls.__mro__[1:]:
        if base.__module__.split(".")[0] not in LIBRARIES:
            continue
        found += [f"{base.__name__}.{name}" for name in vars(cls)
                  if name.startswith("_") and not name.startswith("__") and name in vars(base)
                  and name not in _MADE_BY_METACLASSES]
    return found


def test_the_private_override_check_sees_them():
    from lightning.pytorch.cli import LightningCLI

    class Overriding(LightningCLI):
        def _run_subcommand(self, subcommand):
            pass

        def _own_helper(self):
            pass

    assert _private_overrides(Overriding) == ["LightningCLI._run_subcommand"]


def test_no_class_overrides_a_private_name_of_the_libraries():
    import importlib
    import inspect

    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "__main__.py":  # runs a command when imported
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            module = importlib.import_module(name.removesuffix(".__init__"))
            for cls in vars(module).values():
                if inspect.isclass(cls) and cls.__module__ == module.__name__:
                    overrides = _private_overrides(cls)
                    if overrides:
                        found[cls.__qualname__] = overrides
    assert found == {}
