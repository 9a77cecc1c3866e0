"""`captioner fetch-spice`: idempotent, verified, Maven first then HTTPS; clear errors."""

import io
import os
import shutil

import pytest

import eval.metrics.spice_jars as spice_jars
from eval.commands import fetch_spice as fetch_command
from eval.metrics.spice_jars import ARTIFACTS, SpiceJarsError, fetch_spice, locate_spice

ASM_TREE = next(a for a in ARTIFACTS if a.artifact == "asm-tree")
ASM_UTIL = next(a for a in ARTIFACTS if a.artifact == "asm-util")


@pytest.fixture(scope="module")
def real_install():
    """The installation made by `captioner fetch-spice` (CI runs it before the tests)."""
    return locate_spice()


def _link_tree(source, target):
    for path in source.rglob("*"):
        if path.is_file():
            destination = target / path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, destination)
            except OSError:
                shutil.copyfile(path, destination)


@pytest.fixture
def seeded(tmp_path, real_install):
    cache = tmp_path / "cache"
    _link_tree(real_install.root, cache)
    return cache


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"unexpected download: {args}")

    monkeypatch.setattr(spice_jars.urllib.request, "urlopen", refuse)


def test_fetch_is_idempotent(seeded, tmp_path, no_network):
    inodes = {p: p.stat().st_ino for p in seeded.rglob("*.jar")}
    lines = []
    install = fetch_spice(seeded, maven_repo=tmp_path / "m2", use_mvn=False, log=lines.append)
    assert install.root == seeded
    assert lines == [f"ok       {a.coordinates}" for a in ARTIFACTS]
    assert {p: p.stat().st_ino for p in seeded.rglob("*.jar")} == inodes


def test_missing_jar_is_taken_from_the_maven_repository(seeded, tmp_path, real_install, no_network):
    (seeded / "modules" / ASM_TREE.filename).unlink()
    with pytest.raises(SpiceJarsError, match="captioner fetch-spice"):
        locate_spice(seeded)
    repo = tmp_path / "m2"
    (repo / ASM_TREE.repo_path).parent.mkdir(parents=True)
    shutil.copyfile(real_install.modules_dir / ASM_TREE.filename, repo / ASM_TREE.repo_path)
    lines = []
    fetch_spice(seeded, maven_repo=repo, use_mvn=False, log=lines.append)
    assert f"copy     {ASM_TREE.coordinates} from {repo / ASM_TREE.repo_path}" in lines
    locate_spice(seeded)


def test_corrupt_jar_is_downloaded_again_from_maven_central(
    seeded, tmp_path, real_install, monkeypatch
):
    target = seeded / "modules" / ASM_UTIL.filename
    target.unlink()  # a hard link: never write through it
    target.write_bytes(b"PK not really a jar")
    good = (real_install.modules_dir / ASM_UTIL.filename).read_bytes()
    urls = []

    def serve(url, timeout):
        urls.append(url)
        return io.BytesIO(good)

    monkeypatch.setattr(spice_jars.urllib.request, "urlopen", serve)
    fetch_spice(seeded, maven_repo=tmp_path / "m2", use_mvn=False, progress=False, log=print)
    assert urls == [f"https://repo1.maven.org/maven2/{ASM_UTIL.repo_path}"]
    assert target.read_bytes() == good


def test_a_download_that_fails_verification_is_rejected(seeded, tmp_path, monkeypatch):
    target = seeded / "modules" / ASM_UTIL.filename
    target.unlink()
    monkeypatch.setattr(
        spice_jars.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(b"x" * ASM_UTIL.size)
    )
    with pytest.raises(SpiceJarsError, match="verification failed for org.ow2.asm:asm-util"):
        fetch_spice(seeded, maven_repo=tmp_path / "m2", use_mvn=False, progress=False)
    assert not target.exists()


def test_empty_cache_names_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTIONER_SPICE_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(SpiceJarsError, match="run 'captioner fetch-spice'") as info:
        locate_spice()
    assert "stanford-corenlp-3.6.0-models.jar: missing" in str(info.value)
    # score and evaluate have no --cache-dir: the hint names the variable they read
    assert "--cache-dir DIR are found with CAPTIONER_SPICE_DIR=DIR" in str(info.value)


def test_fetch_spice_command(seeded, tmp_path, capsys, no_network):
    argv = ["--cache-dir", str(seeded), "--no-mvn", "--maven-repo", str(tmp_path / "m2")]
    assert fetch_command.main(argv) == 0
    assert f"SPICE is ready in {seeded}" in capsys.readouterr().out


def test_missing_copy_of_a_pycocoevalcap_jar_is_restored(seeded, tmp_path, no_network):
    jar = seeded / "lib" / "json-simple-1.1.1.jar"
    jar.unlink()
    fetch_spice(seeded, maven_repo=tmp_path / "m2", use_mvn=False, log=lambda _: None)
    assert jar.read_bytes() == (spice_jars.PYCOCOEVALCAP_SPICE_DIR / "lib" / jar.name).read_bytes()


def test_a_cache_dir_that_cannot_be_a_folder_is_one_line(tmp_path, capsys):
    from eval.commands import fetch_spice

    file = tmp_path / "metrics.json"
    file.write_text("{}")
    for cache, message in ((file, f"{file}: exists and is not a folder"),
                           (file / "spice", f"{file / 'spice'}: cannot write to it: {file} is "
                                            "not a folder")):
        assert fetch_spice.main(["--cache-dir", str(cache), "--quiet"]) == 2
        assert capsys.readouterr().err.strip() == f"captioner fetch-spice: {message}"
