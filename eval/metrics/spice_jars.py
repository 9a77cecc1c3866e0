"""The jars SPICE 1.0 needs on Java 17, and ``captioner fetch-spice`` that installs them.

SPICE 1.0 (``spice-1.0.jar`` shipped in pycocoevalcap) loads Stanford CoreNLP 3.6.0 and its
models from ``lib/`` beside itself (the manifest's Class-Path); pycocoevalcap leaves them out
and its downloader targets a host that is often unreachable. SPICE also writes its output
through the Nashorn JavaScript engine, which left the JDK in Java 15 and is missing from
runtimes jlinked without ``jdk.scripting.nashorn`` (e.g. slim Java 11 images); Nashorn 15.4
(Java 11+) and the ASM 7.3.1 jars it needs run as modules (``--module-path``) whenever the
runtime lacks its own (:func:`eval.metrics.spice.java_has_nashorn`). All of them are on Maven
Central.

Cache layout (``spice_cache_dir()``; default ``~/.cache/captioner/spice``, env
``CAPTIONER_SPICE_DIR``)::

    spice-1.0.jar            copy of pycocoevalcap's jar (so ``lib/`` can sit beside it)
    lib/*.jar                pycocoevalcap's spice/lib jars + CoreNLP 3.6.0 and its models
    modules/*.jar            nashorn-core 15.4, asm* 7.3.1

Sources, in order: the local Maven repository (``~/.m2/repository``), ``mvn dependency:get``
into it when Maven is installed, plain HTTPS from Maven Central. Every jar is verified by
size, SHA-1 (Maven Central's published digest) and a class it must contain.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pycocoevalcap.spice as _pycocoevalcap_spice

from data_prep.wording import first_names

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
SPICE_JAR_NAME = "spice-1.0.jar"
PYCOCOEVALCAP_SPICE_DIR = Path(_pycocoevalcap_spice.__file__).parent
FETCH_HINT = ("run 'captioner fetch-spice' to install them (jars installed with its "
              "--cache-dir DIR are found with CAPTIONER_SPICE_DIR=DIR)")
SHOWN_PROBLEMS = 3  # missing or damaged files named in the one-line error; the rest counted


class SpiceJarsError(RuntimeError):
    """SPICE's jars are missing or damaged; the message says to run ``captioner fetch-spice``."""


@dataclass(frozen=True)
class MavenArtifact:
    """One jar on Maven Central, with what it must look like once downloaded."""

    group: str
    artifact: str
    version: str
    size: int
    sha1: str
    probe: str  # an entry the jar must contain
    folder: str  # "lib" (SPICE's Class-Path) or "modules" (Java module path)
    classifier: str | None = None

    @property
    def filename(self) -> str:
        suffix = f"-{self.classifier}" if self.classifier else ""
        return f"{self.artifact}-{self.version}{suffix}.jar"

    @property
    def repo_path(self) -> str:
        return f"{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.filename}"

    @property
    def coordinates(self) -> str:
        tail = f":jar:{self.classifier}" if self.classifier else ""
        return f"{self.group}:{self.artifact}:{self.version}{tail}"


ARTIFACTS: tuple[MavenArtifact, ...] = (
    MavenArtifact(
        "edu.stanford.nlp",
        "stanford-corenlp",
        "3.6.0",
        7_270_741,
        "078d130323856e71e4223ab4962a3f86bc98bd8a",
        "edu/stanford/nlp/pipeline/StanfordCoreNLP.class",
        "lib",
    ),
    MavenArtifact(
        "edu.stanford.nlp",
        "stanford-corenlp",
        "3.6.0",
        378_116_526,
        "e23de94a12edac0dd04dc67db94d18d8982b516f",
        "edu/stanford/nlp/models/lexparser/englishPCFG.ser.gz",
        "lib",
        "models",
    ),
    MavenArtifact(
        "org.openjdk.nashorn",
        "nashorn-core",
        "15.4",
        2_167_292,
        "f67f5ffaa5f5130cf6fb9b133da00c7df3b532a5",
        "org/openjdk/nashorn/api/scripting/NashornScriptEngineFactory.class",
        "modules",
    ),
    MavenArtifact(
        "org.ow2.asm",
        "asm",
        "7.3.1",
        121_836,
        "7ec32f922315924e82bf58b36ee1b673b2a9b820",
        "org/objectweb/asm/ClassVisitor.class",
        "modules",
    ),
    MavenArtifact(
        "org.ow2.asm",
        "asm-commons",
        "7.3.1",
        71_548,
        "daaa79ef260eb67404b9a52bc319a024c7f49cfe",
        "org/objectweb/asm/commons/Remapper.class",
        "modules",
    ),
    MavenArtifact(
        "org.ow2.asm",
        "asm-tree",
        "7.3.1",
        52_826,
        "587ce54d243145b2e89598bfcea7823ded73be5d",
        "org/objectweb/asm/tree/ClassNode.class",
        "modules",
    ),
    MavenArtifact(
        "org.ow2.asm",
        "asm-util",
        "7.3.1",
        84_817,
        "cac1bf54c2fb86671c357d281d1060fe5d50a0de",
        "org/objectweb/asm/util/CheckClassAdapter.class",
        "modules",
    ),
    MavenArtifact(
        "org.ow2.asm",
        "asm-analysis",
        "7.3.1",
        33_446,
        "045dfd299ea0c17d534499c4f06417ceccfa2d02",
        "org/objectweb/asm/tree/analysis/Analyzer.class",
        "modules",
    ),
)


@dataclass(frozen=True)
class SpiceInstall:
    """A verified SPICE installation: ``java [--module-path modules_dir] -jar jar``."""

    root: Path

    @property
    def jar(self) -> Path:
        return self.root / SPICE_JAR_NAME

    @property
    def lib_dir(self) -> Path:
        return self.root / "lib"

    @property
    def modules_dir(self) -> Path:
        return self.root / "modules"


def spice_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir`` if given, else env ``CAPTIONER_SPICE_DIR``, else ~/.cache/captioner/spice."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("CAPTIONER_SPICE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "captioner" / "spice"


def default_maven_repo() -> Path:
    return Path.home() / ".m2" / "repository"


def _bundled_jars() -> list[Path]:
    """pycocoevalcap's spice-1.0.jar and its spice/lib jars (CoreNLP not among them)."""
    jar = PYCOCOEVALCAP_SPICE_DIR / SPICE_JAR_NAME
    if not jar.is_file():
        raise SpiceJarsError(f"pycocoevalcap's SPICE jar is missing: {jar} (reinstall it)")
    return [jar, *sorted((PYCOCOEVALCAP_SPICE_DIR / "lib").glob("*.jar"))]


def _sha1(path: Path) -> str:
    digest = hashlib.sha1()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _jar_problem(path: Path, artifact: MavenArtifact, *, check_digest: bool) -> str | None:
    """Why ``path`` is not a good copy of ``artifact`` (None when it is)."""
    if not path.is_file():
        return f"{path}: missing"
    size = path.stat().st_size
    if size != artifact.size:
        return f"{path}: {size} bytes, expected {artifact.size}"
    try:
        with zipfile.ZipFile(path) as jar:
            jar.getinfo(artifact.probe)
    except (zipfile.BadZipFile, KeyError):
        return f"{path}: not a jar containing {artifact.probe}"
    if check_digest and (digest := _sha1(path)) != artifact.sha1:
        return f"{path}: SHA-1 {digest}, expected {artifact.sha1}"
    return None


def locate_spice(cache_dir: str | os.PathLike[str] | None = None) -> SpiceInstall:
    """The installation in ``spice_cache_dir(cache_dir)``, checked quickly (presence, sizes,
    probe classes). Raises SpiceJarsError listing what is wrong and naming fetch-spice."""
    install = SpiceInstall(spice_cache_dir(cache_dir))
    problems = [
        problem
        for artifact in ARTIFACTS
        if (
            problem := _jar_problem(
                install.root / artifact.folder / artifact.filename, artifact, check_digest=False
            )
        )
    ]
    for source in _bundled_jars():
        target = install.root / source.relative_to(PYCOCOEVALCAP_SPICE_DIR)
        if not target.is_file() or target.stat().st_size != source.stat().st_size:
            problems.append(f"{target}: missing or not a copy of {source}")
    if problems:
        shown = first_names(problems, SHOWN_PROBLEMS, separator="; ")  # the problems hold commas
        raise SpiceJarsError(
            f"SPICE's jars are not installed in {install.root}; {FETCH_HINT} ({shown})"
        )
    return install


def _place(source: Path, target: Path, *, link: bool) -> None:
    """Put a copy of ``source`` at ``target`` atomically (never writing through an existing
    hard link); with ``link``, hard-link instead of copying when on the same file system."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    partial.unlink(missing_ok=True)
    try:
        if not link:
            raise OSError("copy requested")
        os.link(source, partial)
    except OSError:
        shutil.copyfile(source, partial)
    os.replace(partial, target)


def _mvn_get(artifact: MavenArtifact, maven_repo: Path) -> None:
    """``mvn dependency:get`` the artifact (no transitive dependencies) into ``maven_repo``."""
    cmd = [
        "mvn",
        "-q",
        "-B",
        "dependency:get",
        f"-Dartifact={artifact.coordinates}",
        "-Dtransitive=false",
        f"-Dmaven.repo.local={maven_repo}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SpiceJarsError(
            f"'{' '.join(cmd)}' failed ({proc.returncode}):\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )


def _download(url: str, target: Path, size: int, progress: bool) -> None:
    """Stream ``url`` to ``target`` (via a .part file) with a tqdm progress bar."""
    from tqdm.auto import tqdm

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    with (
        urllib.request.urlopen(url, timeout=60) as response,  # noqa: S310 (fixed https URL)
        partial.open("wb") as out,
        tqdm(total=size, unit="B", unit_scale=True, desc=target.name, disable=not progress) as bar,
    ):
        while chunk := response.read(1 << 20):
            out.write(chunk)
            bar.update(len(chunk))
    os.replace(partial, target)


def fetch_spice(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    maven_repo: Path | None = None,
    use_mvn: bool = True,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> SpiceInstall:
    """Install and verify everything SPICE needs in ``spice_cache_dir(cache_dir)``.

    Idempotent: jars already present and verified (size, SHA-1, probe class) are kept. Each
    missing jar comes from ``maven_repo`` (default ~/.m2/repository) if there, else from
    ``mvn dependency:get`` when ``use_mvn`` and Maven is installed, else by HTTPS from Maven
    Central. Raises SpiceJarsError when a jar cannot be obtained or fails verification."""
    install = SpiceInstall(spice_cache_dir(cache_dir))
    maven_repo = default_maven_repo() if maven_repo is None else maven_repo
    for source in _bundled_jars():
        target = install.root / source.relative_to(PYCOCOEVALCAP_SPICE_DIR)
        if not target.is_file() or target.stat().st_size != source.stat().st_size:
            _place(source, target, link=False)
    for artifact in ARTIFACTS:
        target = install.root / artifact.folder / artifact.filename
        if _jar_problem(target, artifact, check_digest=True) is None:
            log(f"ok       {artifact.coordinates}")
            continue
        local = maven_repo / artifact.repo_path
        if _jar_problem(local, artifact, check_digest=True) is not None and use_mvn:
            if shutil.which("mvn"):
                log(f"maven    {artifact.coordinates}")
                try:
                    _mvn_get(artifact, maven_repo)
                except (SpiceJarsError, subprocess.TimeoutExpired) as exc:
                    log(f"         mvn failed, falling back to HTTPS: {str(exc).splitlines()[0]}")
        if _jar_problem(local, artifact, check_digest=True) is None:
            log(f"copy     {artifact.coordinates} from {local}")
            _place(local, target, link=True)
        else:
            url = f"{MAVEN_CENTRAL}/{artifact.repo_path}"
            log(f"download {url}")
            try:
                _download(url, target, artifact.size, progress)
            except OSError as exc:
                raise SpiceJarsError(f"could not download {url}: {exc}") from exc
        if problem := _jar_problem(target, artifact, check_digest=True):
            target.unlink(missing_ok=True)
            raise SpiceJarsError(f"verification failed for {artifact.coordinates}: {problem}")
    return locate_spice(install.root)


def install_spice(
    cache_dir: Path | None = None,
    maven_repo: Path | None = None,
    mvn: bool = True,
    quiet: bool = False,
) -> int:
    """Download and verify the jars SPICE needs (:func:`fetch_spice`), saying where they went;
    the exit status: 0, 2 when ``cache_dir`` cannot be written, 1 when a jar could not be had.

    Args:
        cache_dir: where to install (default: $CAPTIONER_SPICE_DIR or
            ~/.cache/captioner/spice).
        maven_repo: local Maven repository to take jars from first (default:
            ~/.m2/repository).
        mvn: run 'mvn dependency:get' for a missing jar (--no_mvn: download missing jars
            over HTTPS instead).
        quiet: no progress bars or log lines.
    """
    from captioner.reporting import report_error
    from data_prep.paths import check_output_dir

    prog = "captioner fetch-spice"
    try:
        check_output_dir(spice_cache_dir(cache_dir))
    except ValueError as exc:
        return report_error(prog, exc)
    try:
        install = fetch_spice(
            cache_dir,
            maven_repo=Path(maven_repo or default_maven_repo()).expanduser(),
            use_mvn=mvn,
            progress=not quiet,
            log=(lambda _: None) if quiet else print,
        )
    except (SpiceJarsError, OSError) as exc:
        return report_error(prog, exc, status=1)
    print(f"SPICE is ready in {install.root}")
    return 0
