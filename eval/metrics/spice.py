"""SPICE (Anderson et al. 2016) through SPICE 1.0 on a modern Java.

Runs ``java -Xmx.. [--module-path <modules> --add-modules org.openjdk.nashorn] -jar
spice-1.0.jar IN -out OUT -subset -silent -threads N`` from the installation made by
``captioner fetch-spice`` (:mod:`eval.metrics.spice_jars`), in a temporary directory of our own,
with
a timeout, surfacing Java's stderr on failure.

SPICE writes its output through the Nashorn JavaScript engine. Whether the runtime has it
built in is decided by the runtime's modules, not its version number: ``java --list-modules``
listing ``jdk.scripting.nashorn`` means built in (Java 9-14 as shipped); otherwise (Java 15+,
and an older runtime jlinked without it, e.g. a slim Java 11) the standalone nashorn-core and
its ASM jars are added as modules. Java 8 has no ``--list-modules`` and always has Nashorn.
The probe runs once per java executable (:func:`eval.metrics.java_tools.java_modules`).

SPICE's ``-cache`` is not used: its LMDB cache needs ``--add-opens`` on Java 16+ and shared
caches are reported to freeze, while a fresh cache per run would save nothing. Scores match
pycocoevalcap's ``Spice`` (same jar and flags; the cache only memoizes parses).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from data_prep.machine import usable_cpus
from eval.metrics.java_tools import java_modules, java_work_folder, run_java
from eval.metrics.spice_jars import SpiceInstall, locate_spice

NASHORN_MODULE = "org.openjdk.nashorn"  # the standalone nashorn-core installed by fetch-spice
BUILTIN_NASHORN_MODULE = "jdk.scripting.nashorn"  # the JDK's own, removed in Java 15


def java_has_nashorn() -> bool:
    """Whether the Java runtime on PATH has Nashorn built in (Java 8: always)."""
    modules = java_modules()
    return modules is None or BUILTIN_NASHORN_MODULE in modules


def default_max_heap() -> str:
    """JVM heap for SPICE: 8 GB (pycocoevalcap's setting) when the machine has 16 GB or more,
    else half the physical memory, at least 3 GB (CoreNLP's parser and NER models)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gib = max(3, min(8, total // (2 << 30)))
    return f"{gib}g"


def spice_java_args(
    install: SpiceInstall, input_json: Path, output_json: Path, *, threads: int, max_heap: str
) -> list[str]:
    """Arguments after ``java`` for one SPICE run (the standalone Nashorn modules only when
    the runtime lacks its own, see :func:`java_has_nashorn`)."""
    args = [f"-Xmx{max_heap}"]
    if not java_has_nashorn():
        args += ["--module-path", str(install.modules_dir), "--add-modules", NASHORN_MODULE]
    return [
        *args,
        "-jar",
        str(install.jar),
        str(input_json),
        "-out",
        str(output_json),
        "-subset",
        "-silent",
        "-threads",
        str(threads),
    ]


def _to_float(value: object) -> float:
    # SPICE writes null for undefined precision/recall/F (e.g. no tuples); pycocoevalcap -> NaN.
    return math.nan if value is None else float(value)


def spice_scores(
    hypotheses: Mapping[int, str],
    references: Mapping[int, Sequence[str]],
    *,
    install: SpiceInstall | None = None,
    threads: int | None = None,
    max_heap: str | None = None,
    timeout: float | None = None,
) -> tuple[float, dict[int, dict[str, dict[str, float]]]]:
    """SPICE of each hypothesis against its references (captions already tokenized).

    Returns ``(corpus, per_image)``: ``corpus`` is the mean over images of the "All" F-score
    (pycocoevalcap's definition; NaN if any image's F is undefined) and ``per_image[id]`` maps
    each tuple category ("All", "Object", "Attribute", "Relation", "Color", "Count",
    "Material", "Shape", "Size", "Cardinality") to ``{"pr", "re", "f", "tp", "fp", "fn",
    "numImages"}``. ``timeout`` defaults to 10 minutes plus 0.2 s per caption."""
    if hypotheses.keys() != references.keys():
        raise ValueError("hypotheses and references must have the same image ids")
    install = locate_spice() if install is None else install
    n_captions = sum(1 + len(refs) for refs in references.values())
    timeout = 600 + 0.2 * n_captions if timeout is None else timeout
    records = [
        {"image_id": image_id, "test": hypotheses[image_id], "refs": list(references[image_id])}
        for image_id in hypotheses
    ]
    with java_work_folder("spice") as tmp:
        input_json, output_json = tmp / "input.json", tmp / "output.json"
        input_json.write_text(json.dumps(records), encoding="utf-8")
        args = spice_java_args(
            install,
            input_json,
            output_json,
            threads=threads or usable_cpus(),
            max_heap=max_heap or default_max_heap(),
        )
        run_java(args, tool="SPICE", cwd=tmp, timeout=timeout)
        text = output_json.read_text(encoding="utf-8") if output_json.is_file() else ""
    if not text.strip():
        raise RuntimeError(
            "SPICE exited normally but wrote no scores (this means Nashorn was not loaded; "
            f"re-run 'captioner fetch-spice'): {install.root}"
        )
    per_image = {
        int(item["image_id"]): {
            category: {name: _to_float(value) for name, value in stats.items()}
            for category, stats in item["scores"].items()
        }
        for item in json.loads(text)
    }
    if per_image.keys() != hypotheses.keys():
        raise RuntimeError(
            f"SPICE returned scores for {len(per_image)} images, expected {len(hypotheses)}"
        )
    corpus = float(np.mean(np.array([per_image[i]["All"]["f"] for i in hypotheses])))
    return corpus, per_image
