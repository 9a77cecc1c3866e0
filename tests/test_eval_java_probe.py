"""SPICE's Nashorn: decided by the runtime's modules (``java --list-modules``), not its version.

Fake ``java`` executables on PATH stand for runtimes this machine does not have (a Java 11
jlinked without Nashorn, a full Java 11, Java 8); the real Java on PATH is probed last."""

import os
import shutil
import stat

import pytest

from eval.metrics.java_tools import JavaToolError
from eval.metrics.spice import NASHORN_MODULE, spice_java_args
from eval.metrics.spice_jars import SpiceInstall

JAVA_11_MODULES = ["java.base@11.0.13", "java.logging@11.0.13", "java.scripting@11.0.13"]


def _fake_java(folder, *, version, modules):
    """A ``java`` script printing ``version`` for -version and ``modules`` for --list-modules
    (``modules=None``: the option is unknown, as on Java 8); it logs each call to calls.log."""
    folder.mkdir()
    if modules is None:
        list_modules = 'echo "Unrecognized option: --list-modules" >&2; exit 1'
    else:
        list_modules = "printf '%s\\n' " + " ".join(modules)
    script = folder / "java"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{folder}/calls.log"\n'
        'case "$1" in\n'
        f"  -version) echo 'openjdk version \"{version}\" 2021-10-19' >&2 ;;\n"
        f"  --list-modules) {list_modules} ;;\n"
        "  *) exit 3 ;;\n"
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def _args(tmp_path):
    install = SpiceInstall(tmp_path / "spice")
    return install, spice_java_args(
        install, tmp_path / "in.json", tmp_path / "out.json", threads=1, max_heap="3g"
    )


def _on_path(monkeypatch, folder):
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


def _calls(folder):
    return (folder / "calls.log").read_text().splitlines()


def test_java_11_without_the_nashorn_module_gets_nashorn_core(tmp_path, monkeypatch):
    java = _fake_java(tmp_path / "jlinked11", version="11.0.13", modules=JAVA_11_MODULES)
    _on_path(monkeypatch, java)
    install, args = _args(tmp_path)
    i = args.index("--module-path")
    assert args[i : i + 4] == [
        "--module-path", str(install.modules_dir), "--add-modules", NASHORN_MODULE
    ]  # fmt: skip
    assert args.index("-jar") > i
    # The probe runs once per java executable, however many SPICE runs follow.
    _args(tmp_path)
    assert _calls(java) == ["--list-modules"]


def test_java_11_with_the_nashorn_module_uses_its_own(tmp_path, monkeypatch):
    modules = [*JAVA_11_MODULES, "jdk.scripting.nashorn@11.0.13"]
    java = _fake_java(tmp_path / "full11", version="11.0.13", modules=modules)
    _on_path(monkeypatch, java)
    _, args = _args(tmp_path)
    assert "--module-path" not in args and "--add-modules" not in args
    assert args[:2] == ["-Xmx3g", "-jar"]


def test_java_8_without_list_modules_has_nashorn_built_in(tmp_path, monkeypatch):
    java = _fake_java(tmp_path / "java8", version="1.8.0_292", modules=None)
    _on_path(monkeypatch, java)
    _, args = _args(tmp_path)
    assert "--module-path" not in args
    _args(tmp_path)
    assert _calls(java) == ["--list-modules", "-version"]


def test_a_modern_java_that_cannot_list_its_modules_is_an_error(tmp_path, monkeypatch):
    java = _fake_java(tmp_path / "broken17", version="17.0.2", modules=None)
    _on_path(monkeypatch, java)
    with pytest.raises(JavaToolError, match=r"could not list the modules of Java 17 .*"):
        _args(tmp_path)


@pytest.mark.java
def test_the_real_java_gets_nashorn_core_exactly_when_it_lacks_the_module(tmp_path):
    import subprocess

    java = shutil.which("java")
    if java is None:
        pytest.skip("no Java on PATH")
    listed = subprocess.run([java, "--list-modules"], capture_output=True, text=True).stdout
    _, args = _args(tmp_path)
    assert ("--module-path" in args) == ("jdk.scripting.nashorn@" not in listed)
