"""Bad and unusual inputs for the robustness tests of the command-line entry points.

Every ``write_*`` function creates one input class at the path it is given (its parent folder
must exist) and returns that path. Images are small (tens of pixels) so that the commands stay
quick; each "good but unusual" image is checked to decode to what it should before a command
sees it, so that a row cannot pass because the writer produced an ordinary file.

:func:`no_hang` and :func:`run_cli` let a test call a command in-process with a deadline: a
command that blocks (opening a FIFO for reading waits for a writer) is interrupted by SIGALRM
with :class:`Hung`, which no ``except Exception`` of a command can swallow.
"""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

SIDE = 24  # pixels per side of the generated images

# ---------------------------------------------------------------------------- running commands


class Hung(BaseException):
    """A command did not return before its deadline (BaseException: never caught by a
    command's ``except Exception``)."""


@contextmanager
def no_hang(seconds: float = 30.0, fifos: tuple[Path, ...] = ()) -> Iterator[None]:
    """Raise :class:`Hung` in the main thread when the block takes longer than ``seconds``
    (SIGALRM interrupts blocking system calls such as opening a FIFO). ``fifos`` are opened
    for writing first, which releases a reader blocked on one in any thread."""

    def alarm(signum, frame):
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader: nothing to release
                pass
        raise Hung(f"still running after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Outcome:
    """What a command did: exit status, standard output and standard error."""

    code: int
    out: str
    err: str

    def error_lines(self, prefix: str) -> list[str]:
        """The lines of stderr that start with ``prefix`` (e.g. ``"captioner caption: "``)."""
        return [line for line in self.err.splitlines() if line.startswith(prefix)]


def run_cli(capsys, argv: list, *, seconds: float = 60.0, fifos: tuple[Path, ...] = ()) -> Outcome:
    """``captioner ARGV`` in this process through the console script's dispatcher
    (:func:`captioner.cli.main`), with a deadline (see :func:`no_hang`); argparse exits
    become exit statuses."""
    from captioner.cli import main

    capsys.readouterr()
    with no_hang(seconds, fifos):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)


def run_subprocess(argv: list, *, cwd: Path | None = None, seconds: float = 120.0) -> Outcome:
    """``captioner ARGV`` as a separate process (the installed console script), with a timeout
    that fails the test instead of hanging it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    script = Path(sys.executable).with_name("captioner")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "captioner.cli"]
    try:
        done = subprocess.run([*command, *map(str, argv)], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=seconds, check=False)
    except subprocess.TimeoutExpired as exc:
        raise Hung(f"captioner {argv[0]} still running after {seconds:g} s") from exc
    return Outcome(done.returncode, done.stdout, done.stderr)


def leftover_temporaries(folder: Path) -> list[Path]:
    """Temporary files of :func:`data_prep.atomic.atomic_write` (``.NAME.*.tmp``) under
    ``folder``."""
    return sorted(p for p in Path(folder).rglob(".*.tmp"))


def assert_user_error(outcome: Outcome, command: str, *phrases: str) -> str:
    """Exit status 2, no traceback, and exactly one line ``captioner COMMAND: ...`` that holds
    every phrase; returns that line."""
    prefix = f"captioner {command}: "
    assert outcome.code == 2, (outcome.code, outcome.err[-3000:])
    assert "Traceback" not in outcome.err, outcome.err[-3000:]
    lines = outcome.error_lines(prefix)
    assert len(lines) == 1, outcome.err[-3000:]
    for phrase in phrases:
        assert phrase in lines[0], (phrase, lines[0])
    return lines[0]


def assert_skipped(outcome: Outcome, command: str, image: Path, phrase: str) -> None:
    """Exit status 1, no traceback, and exactly one line ``captioner COMMAND: ... skipped ...``
    that names ``image`` and holds ``phrase``."""
    assert outcome.code == 1, outcome.err
    assert "Traceback" not in outcome.err
    skipped = [line for line in outcome.error_lines(f"captioner {command}: ") if "skipped" in line]
    assert len(skipped) == 1 and str(image) in skipped[0] and phrase in skipped[0], outcome.err


# ------------------------------------------------------------------------------ image files


def _pixels(seed: int = 0, side: int = SIDE) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)


def write_png(path: Path, seed: int = 0) -> Path:
    """An ordinary 8-bit RGB PNG."""
    Image.fromarray(_pixels(seed)).save(path, "PNG")
    return path


def write_zero_byte(path: Path) -> Path:
    path.write_bytes(b"")
    return path


def write_text_as_jpg(path: Path) -> Path:
    path.write_text("this is a shopping list, not a photo\n")
    return path


def write_truncated_jpeg(path: Path) -> Path:
    """The first half of a valid JPEG of noise (the entropy-coded data stops mid-scan)."""
    data = io.BytesIO()
    Image.fromarray(_pixels(1, 64)).save(data, "JPEG", quality=90)
    path.write_bytes(data.getvalue()[: len(data.getvalue()) // 2])
    return path


def png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` RGB pixels and holds no pixel data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def write_decompression_bomb(path: Path) -> Path:
    """A 60-byte PNG whose header claims 100,000 x 100,000 pixels (30 GB decoded)."""
    path.write_bytes(png_header(100_000, 100_000))
    return path


def write_cmyk_jpeg(path: Path) -> Path:
    Image.fromarray(_pixels(2)).convert("CMYK").save(path, "JPEG", quality=95)
    with Image.open(path) as image:
        assert image.mode == "CMYK"
    return path


def write_png16(path: Path) -> Path:
    """A 16-bit grayscale PNG using the whole 0..65535 range."""
    ramp = np.linspace(0, 65535, SIDE * SIDE).reshape(SIDE, SIDE).astype(np.uint16)
    Image.fromarray(ramp).save(path, "PNG")
    with Image.open(path) as image:
        assert image.mode in ("I;16", "I", "I;16B"), image.mode
    return path


def write_palette_alpha_png(path: Path) -> Path:
    """A palette PNG whose colour 0 is transparent."""
    indices = (np.arange(SIDE * SIDE).reshape(SIDE, SIDE) % 4).astype(np.uint8)
    image = Image.fromarray(indices, "P")
    image.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255] + [0] * (256 * 3 - 12))
    image.save(path, "PNG", transparency=0)
    with Image.open(path) as check:
        assert check.mode == "P" and "transparency" in check.info
    return path


def write_exif_rotated_jpeg(path: Path) -> Path:
    """A 32 x 16 JPEG with EXIF orientation 6 (displayed rotated: 16 x 32)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (16, 32, 3), dtype=np.uint8)).save(
        path, "JPEG", exif=exif.tobytes())
    with Image.open(path) as image:
        assert image.getexif().get(0x0112) == 6
    return path


def write_animated_gif(path: Path) -> Path:
    frames = [Image.fromarray(_pixels(seed)).convert("P") for seed in range(3)]
    frames[0].save(path, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    with Image.open(path) as image:
        assert image.n_frames == 3
    return path


def write_webp(path: Path) -> Path:
    Image.fromarray(_pixels(4)).save(path, "WEBP", quality=80)
    with Image.open(path) as image:
        assert image.format == "WEBP"
    return path


def write_symlink_loop(path: Path) -> Path:
    """``path`` -> ``path.loop`` -> ``path``: opening either fails with ELOOP."""
    partner = path.with_name(path.name + ".loop")
    os.symlink(partner.name, path)
    os.symlink(path.name, partner)
    return path


def write_full_device(path: Path) -> Path:
    """A private copy of ``/dev/full`` (character device 1, 7: every write fails with ENOSPC),
    so that a command that wrongly replaces its output file cannot damage the real one.
    Needs CAP_MKNOD; the calling test is skipped without it."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")
    return path


def is_full_device(path: Path) -> bool:
    """``path`` is still the character device that :func:`write_full_device` made."""
    mode = os.lstat(path).st_mode
    return stat.S_ISCHR(mode) and os.stat(path).st_rdev == os.makedev(1, 7)


def write_fifo(path: Path) -> Path:
    """A named pipe: opening it for reading blocks until a writer appears."""
    os.mkfifo(path)
    return path


def unreadable_file_rows(name: str, *, empty: str, folder: str) -> list:
    """Three pytest rows of an input file ``name`` that cannot be read: a zero-byte file, a
    folder and a FIFO. Each row's value, called with a folder, makes that input there and
    returns (its path, the phrase that names the problem: ``empty``, ``folder``, "FIFO")."""

    def zero_byte(parent: Path) -> tuple[Path, str]:
        return write_zero_byte(parent / name), empty

    def directory(parent: Path) -> tuple[Path, str]:
        (parent / name).mkdir()
        return parent / name, folder

    def fifo(parent: Path) -> tuple[Path, str]:
        return write_fifo(parent / name), "FIFO"

    return [
        pytest.param(zero_byte, id="zero-byte file"),
        pytest.param(directory, id="folder"),
        pytest.param(fifo, id="FIFO"),
    ]


# ---------------------------------------------------------------------------- output paths

KEEP_ME = "keep me"  # text of the regular file an unusable output path is made from


def unusable_out(kind: str, folder: Path, name: str = "out") -> Path:
    """An output path in ``folder`` that no command may write to, of class ``kind``:

    * ``"folder"``: the existing folder ``folder/existing``;
    * ``"file"``: the existing regular file ``folder/somefile.txt`` (holding :data:`KEEP_ME`),
      for commands whose output is a folder;
    * ``"under a file"``: ``folder/somefile.txt/NAME``, below that regular file;
    * ``"device"``: ``folder/full``, a copy of ``/dev/full`` (see :func:`write_full_device`).
    """
    if kind == "folder":
        (folder / "existing").mkdir()
        return folder / "existing"
    if kind == "device":
        return write_full_device(folder / "full")
    regular = folder / "somefile.txt"
    regular.write_text(KEEP_ME)
    if kind == "file":
        return regular
    assert kind == "under a file", kind
    return regular / name


def names_under(folder: Path) -> list[str]:
    """The names of everything below ``folder``, sorted: equal before and after a refused
    command when it wrote nothing."""
    return sorted(p.name for p in Path(folder).rglob("*"))


# Good images of unusual formats: every command must read them as ordinary photos.
EXOTIC_IMAGES: dict[str, tuple[str, Callable[[Path], Path]]] = {
    "CMYK JPEG": ("cmyk.jpg", write_cmyk_jpeg),
    "16-bit PNG": ("gray16.png", write_png16),
    "palette PNG with transparency": ("palette.png", write_palette_alpha_png),
    "EXIF-rotated JPEG": ("rotated.jpg", write_exif_rotated_jpeg),
    "animated GIF": ("animated.gif", write_animated_gif),
    "WebP": ("photo.webp", write_webp),
}

# Unusable image files: (file name, writer, phrase of the reason every reader gives).
BAD_IMAGES: dict[str, tuple[str, Callable[[Path], Path], str]] = {
    "zero-byte file": ("empty.jpg", write_zero_byte, "empty.jpg"),
    "text saved as .jpg": ("notes.jpg", write_text_as_jpg, "not an image file"),
    "truncated JPEG": ("cut.jpg", write_truncated_jpeg, "truncated"),
    "decompression bomb": ("bomb.png", write_decompression_bomb, "decompression bomb"),
    "symlink loop": ("loop.png", write_symlink_loop, "loop.png"),
    "FIFO": ("pipe.png", write_fifo, "FIFO"),
}

# File names that a shell, a text format or a file system treat specially (all valid on Linux).
ODD_NAMES: dict[str, str] = {
    "space": "holiday photo 1.png",
    "unicode": "café_日本_ø.png",
    "newline": "two\nlines.png",
    "tab": "tab\there.png",
}

# ------------------------------------------------------------------------------ checkpoints


class _RunsShellCommand:
    """Unpickling this object runs ``touch MARKER`` (what a malicious checkpoint would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


def write_malicious_checkpoint(path: Path, marker: Path) -> Path:
    """A torch checkpoint whose unpickling runs ``touch MARKER``; a safe reader refuses it and
    ``marker`` never appears."""
    import torch

    torch.save({"state_dict": {}, "hyper_parameters": _RunsShellCommand(marker)}, path)
    assert not marker.exists()
    return path


def write_foreign_state_dict(path: Path) -> Path:
    """torchvision's ResNet-18 ``state_dict`` (random weights) saved with ``torch.save``: a
    valid torch file holding only tensors, but not a captioner checkpoint."""
    import torch
    import torchvision

    torch.save(torchvision.models.resnet18(weights=None).state_dict(), path)
    return path


def write_class_path_checkpoint(source: Path, path: Path) -> Path:
    """``source`` (a captioner checkpoint) with a hyperparameter that names code to import."""
    from captioner.checkpointing import load_safely, save_atomically

    checkpoint = load_safely(source)
    checkpoint["hyper_parameters"]["output_attention_kwargs"] = {
        "lam": {"class_path": "this.Zen", "init_args": {}}
    }
    save_atomically(checkpoint, path)
    return path


def write_altered_checkpoint(source: Path, path: Path, alter: Callable[[dict], None]) -> Path:
    """``source`` (a captioner checkpoint) changed in place by ``alter``."""
    from captioner.checkpointing import load_safely, save_atomically

    checkpoint = load_safely(source)
    alter(checkpoint)
    save_atomically(checkpoint, path)
    return path


def _nan_decoder_weight(checkpoint: dict) -> None:
    name = next(name for name in checkpoint["state_dict"] if name.startswith("model.decoder."))
    checkpoint["state_dict"][name].fill_(float("nan"))


def checkpoint_rows(folder: Path, good: Path) -> dict[str, tuple[Path, str]]:
    """Every bad-checkpoint class written into ``folder``: name -> (path, expected phrase).
    The malicious file's marker is ``folder / "EXECUTED"``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "as a folder.ckpt").mkdir(exist_ok=True)
    return {
        "malicious pickle": (
            # The wording differs with the unpickler's message; the file must be named.
            write_malicious_checkpoint(folder / "evil.ckpt", folder / "EXECUTED"), "evil.ckpt"),
        "foreign state_dict": (
            write_foreign_state_dict(folder / "resnet18.pth"), "not a checkpoint written by"),
        "empty file": (write_zero_byte(folder / "empty.ckpt"), "is empty"),
        "folder": (folder / "as a folder.ckpt", "is a folder"),
        "class_path hyperparameters": (
            write_class_path_checkpoint(good, folder / "class_path.ckpt"), "class specification"),
        "NaN weights": (write_altered_checkpoint(good, folder / "nan.ckpt", _nan_decoder_weight),
                        "its weights hold NaN or inf (model.decoder."),
        # A model for 100000 px images would take all memory at the first image.
        "huge image_size": (
            write_altered_checkpoint(good, folder / "huge.ckpt",
                                     lambda c: c["hyper_parameters"].update(image_size=100_000)),
            "model.image_size must be an integer in [1, 8000], got 100000"),
        # Lightning restores these with a KeyError, or resumes without them (a fresh optimizer).
        "no Lightning version": (
            write_altered_checkpoint(good, folder / "unversioned.ckpt",
                                     lambda c: c.pop("pytorch-lightning_version")),
            "no 'pytorch-lightning_version' entry; not a checkpoint written by captioner fit"),
        "no optimizer state": (
            write_altered_checkpoint(good, folder / "no_optimizer.ckpt",
                                     lambda c: c.update(optimizer_states=[])),
            "entry 'optimizer_states' does not hold the state of one optimizer"),
    }


# ------------------------------------------------------------------------- data and results


def karpathy_record(filename: str, image_id: int, split: str) -> dict:
    return {"filename": filename, "imgid": image_id, "cocoid": image_id, "split": split,
            "sentences": [{"raw": "a small picture", "tokens": ["a", "small", "picture"]}]}


def write_karpathy(path: Path, records: list[dict]) -> Path:
    path.write_text(json.dumps({"dataset": "coco", "images": records}, ensure_ascii=False),
                    encoding="utf-8")
    return path


def _mutated(path: Path, mutate: Callable[[dict], None], source: Path) -> Path:
    data = json.loads(source.read_text(encoding="utf-8"))
    mutate(data)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def malformed_karpathy(folder: Path, source: Path) -> dict[str, tuple[Path, str]]:
    """Malformed copies of the Karpathy file ``source`` in ``folder``: name -> (path, phrase
    of the error)."""
    invalid = folder / "invalid.json"
    invalid.write_text('{"dataset": "coco", "images": [', encoding="utf-8")
    return {
        "Karpathy: invalid JSON": (invalid, "not valid JSON"),
        "Karpathy: missing field": (
            _mutated(folder / "no_split.json",
                     lambda d: d["images"][0].pop("split"), source), "'split' is missing"),
        "Karpathy: wrong type": (
            _mutated(folder / "str_id.json",
                     lambda d: d["images"][0].update(cocoid="7"), source), "'cocoid'"),
    }


# ------------------------------------------------------------------- integrity cases (issue 48)
#
# The cases of the integrity list (items 1-16) that a command shows with a prepared input: each
# :class:`IntegrityCase` writes its input under a fresh folder and gives the command line, the
# exit status and what the one line the user sees holds. Cases that need a fault while the
# command runs (SIGKILL, a file size limit, a second process, a dying JVM) cannot be a row:
# :data:`INTEGRITY_COVERED_ELSEWHERE` names the test of each.

FAST = ["--beam-size", "1", "--max-length", "4", "--no-progress", "--device", "cpu"]
TINY_ENCODER = ["--arch", "resnet18", "--layer", "layer3", "--image-size", "32", "--batch-size",
                "8", "--num-workers", "0", "--no-progress", "--device", "cpu"]
NOT_UTF8 = os.fsdecode(b"caf\xe9.png")  # "café.png" in Latin-1: not UTF-8


class Given:
    """What a case's input is made from: ``tmp``, a fresh folder of the case, and the session's
    tiny checkpoint, synthetic dataset and feature cache, made when a case first asks (pytest
    fixtures ``tiny_checkpoint``, ``synthetic_data``, ``cache32``, through ``fixture``)."""

    def __init__(self, tmp: Path, fixture: Callable[[str], object]) -> None:
        self.tmp = tmp
        self._fixture = fixture

    @property
    def checkpoint(self) -> Path:
        return self._fixture("tiny_checkpoint")

    @property
    def data(self):
        return self._fixture("synthetic_data")

    @property
    def cache(self) -> Path:
        return self._fixture("cache32")

    def photos(self, count: int = 2, *extra: str) -> Path:
        """``tmp/photos`` with ``count`` small PNGs and one more under each name of ``extra``."""
        folder = self.tmp / "photos"
        folder.mkdir(exist_ok=True)
        for seed in range(count):
            write_png(folder / f"p{seed}.png", seed=seed)
        for seed, name in enumerate(extra, start=count):
            write_png(folder / name, seed=seed)
        return folder


@dataclass
class Prepared:
    """A case's command line (after ``captioner``), the phrases the one line the user sees
    holds (an error line ``captioner COMMAND: ...`` on stderr for a non-zero status, else the
    line on stdout that holds the first phrase; none: nothing on either), and what must hold of
    the files afterwards (``check(outcome)``)."""

    argv: list
    phrases: tuple[str, ...] = ()
    check: Callable[[Outcome], None] | None = None


@dataclass(frozen=True)
class IntegrityCase:
    item: int  # of the integrity list, 1-16
    code: int  # the exit status
    prepare: Callable[[Given], Prepared]
    marks: tuple = ()  # pytest marks of the row (java: the command runs Java)


def _staging_left_by_a_killed_run(command: str) -> Callable[[Given], Prepared]:
    """Item 4: the staging folder a run killed with SIGKILL leaves in a new --out."""
    from data_prep.output_folders import STAGING_PREFIX

    shown = {"heatmaps": "wrote heatmaps of 2 images x 1 model to ",
             "gallery": "gallery of 2 images x 1 model: ",
             "rating-kit": ": 2 images x 1 model -> "}[command]

    def prepare(given: Given) -> Prepared:
        out = given.tmp / "out"
        staging = out / f"{STAGING_PREFIX}k1ll3d"
        (staging / "p0").mkdir(parents=True)
        (staging / "p0" / "strip.png").write_bytes(b"half a figure")
        extra = ["--n", "2"] if command == "rating-kit" else []

        def check(outcome: Outcome) -> None:
            assert not staging.exists()

        return Prepared([command, given.photos(), "--ckpt", given.checkpoint, "--out", out,
                         *extra, *FAST], (shown,), check)

    return prepare


def _damaged_checkpoint(given: Given) -> Prepared:
    """Item 6: one bit flipped inside the largest tensor, the zip's CRC-32 left as it was."""
    import shutil
    import zipfile

    damaged = given.tmp / "damaged.ckpt"
    shutil.copyfile(given.checkpoint, damaged)
    with zipfile.ZipFile(damaged) as archive:
        member = max((info for info in archive.infolist() if "/data/" in info.filename),
                     key=lambda info: info.file_size)
    with open(damaged, "r+b") as handle:
        handle.seek(member.header_offset)
        names, extra = struct.unpack("<HH", handle.read(30)[26:30])
        handle.seek(member.header_offset + 30 + names + extra + member.compress_size // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x10]))
    out = given.tmp / "captions.txt"

    def check(outcome: Outcome) -> None:
        assert not out.exists()

    return Prepared(["caption", given.photos(1), "--ckpt", damaged, "--out", out, *FAST],
                    (str(damaged), f"{member.filename} fails its CRC-32"), check)


def _small_split(given: Given, count: int = 3) -> tuple[Path, Path]:
    """A split file of ``count`` images (the last one the test split) and their folder."""
    images = given.tmp / "images"
    images.mkdir()
    records = []
    for i in range(count):
        write_png(images / f"{i}.png", seed=i)
        records.append(karpathy_record(f"{i}.png", i, "train" if i < count - 1 else "test"))
    return write_karpathy(given.tmp / "dataset.json", records), images


def _weights_replaced_after_caching(given: Given) -> Prepared:
    """Item 8: a cache made with one weights file, then other weights under its path."""
    from captioner.cli import main

    data, images = _small_split(given)
    weights = write_foreign_state_dict(given.tmp / "encoder.pt")
    out = given.tmp / "f.h5"
    argv = ["prepare-features", "--data", data, "--images", images, "--out", out,
            "--weights", weights, *TINY_ENCODER]
    assert main([str(a) for a in argv]) == 0
    write_foreign_state_dict(weights)  # other random weights under the same path
    return Prepared(argv, (str(out), "made with other settings (the weights file's content "
                                     "(SHA-256"))


def _cache_with_flipped_bits(given: Given) -> Prepared:
    """Item 7: a copy of the feature cache with one mantissa bit flipped in every row's
    stored chunk (where HDF5's own index says it lies), so that the first batch meets one."""
    import shutil

    import h5py
    from conftest import tiny_fit_args

    damaged = given.tmp / "features.h5"
    shutil.copyfile(given.cache, damaged)
    with h5py.File(damaged, "r") as file:
        features = file["features"]
        offsets = [features.id.get_chunk_info_by_coord((row, 0, 0, 0)).byte_offset
                   for row in range(features.shape[0])]
    with open(damaged, "r+b") as handle:
        for offset in offsets:
            handle.seek(offset + 4)
            byte = handle.read(1)
            handle.seek(-1, 1)
            handle.write(bytes([byte[0] ^ 0x01]))
    return Prepared(["fit", *tiny_fit_args("demo_softmax.yaml", given.data, damaged,
                                           given.tmp / "runs"), "--trainer.max_epochs", "1"],
                    (f"{damaged}: the features of image id ", " are damaged"))


def _vocabulary_with_escapes(given: Given) -> Prepared:
    """Item 9: a vocabulary word that clears the screen when printed raw."""

    def poison(checkpoint: dict) -> None:
        checkpoint["vocabulary"]["itos"][4] = "red\x1b[2J\x1b[H"

    ckpt = write_altered_checkpoint(given.checkpoint, given.tmp / "hostile.ckpt", poison)

    def check(outcome: Outcome) -> None:
        assert "\x1b" not in outcome.out + outcome.err

    return Prepared(["caption", given.photos(1), "--ckpt", ckpt, *FAST],
                    (str(ckpt), "vocabulary word 4", "U+001B"), check)


def _split_naming_an_outside_image(command: str) -> Callable[[Given], Prepared]:
    """Item 10: a split file whose test image is ``../secret/x.png``, which exists."""

    def prepare(given: Given) -> Prepared:
        data, images = _small_split(given, 2)
        (given.tmp / "secret").mkdir()
        write_png(given.tmp / "secret" / "x.png", seed=9)
        records = json.loads(data.read_text(encoding="utf-8"))["images"]
        outside = {**karpathy_record("../secret/x.png", 9, "test")}
        write_karpathy(data, [*records, outside])
        out = given.tmp / "out"
        if command == "prepare-features":
            argv = [command, "--data", data, "--images", images, "--out", out,
                    "--weights", "none", *TINY_ENCODER]
        else:
            argv = [command, "--ckpt", given.checkpoint, "--data", data, "--images", images,
                    "--split", "test", "--out", out, *FAST]

        def check(outcome: Outcome) -> None:
            assert not out.exists() or not any(out.iterdir())

        return Prepared(argv, (str(data), "images[2]", "'../secret/x.png'",
                               "leaves the image folder"), check)

    return prepare


def run_folder_holding(root: Path, config_text: str | None = None,
                       progress: dict | None = None) -> Path:
    """``root/demo/version_0`` with its ``checkpoints/`` and, where given, a ``config.yaml`` of
    ``config_text`` and a ``checkpoints/progress.json`` of ``progress``: what ``runs`` reads."""
    folder = root / "demo" / "version_0"
    (folder / "checkpoints").mkdir(parents=True)
    if config_text is not None:
        (folder / "config.yaml").write_text(config_text, encoding="utf-8")
    if progress is not None:
        (folder / "checkpoints" / "progress.json").write_text(json.dumps(progress),
                                                              encoding="utf-8")
    return folder


def _hostile_run_folder(config_text: str | None, progress: dict | None
                        ) -> Callable[[Given], Prepared]:
    """Item 11: ``captioner runs`` over a run folder holding a hostile file; the run is listed
    on one line of reasonable length."""

    def prepare(given: Given) -> Prepared:
        run_folder_holding(given.tmp / "runs", config_text, progress)

        def check(outcome: Outcome) -> None:
            [line] = [line for line in outcome.out.splitlines() if line.startswith("demo ")]
            assert len(line) < 400, line[:400]

        return Prepared(["runs", "--root", given.tmp / "runs"], ("demo ", "version_0"), check)

    return prepare


# 10 levels of 10 aliases each: 10**10 values once expanded, from 500 bytes; used where `runs`
# shows a value (the output mapping's keywords).
ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10))


def _deep_fit_config(given: Given) -> Prepared:
    """Item 11: fit's --config of 100,000 nested ``[``."""
    config = given.tmp / "deep.yaml"
    config.write_text("[" * 100_000, encoding="utf-8")
    return Prepared(["fit", "--config", config],
                    (f"--config {config}: ", "nested more than 64 levels deep"))


def _not_utf8_name(command: str, *extra: str) -> Callable[[Given], Prepared]:
    """Item 12: an image whose file name is not UTF-8, beside a plain one: refused before any
    work, nothing written."""

    def prepare(given: Given) -> Prepared:
        photos = given.photos(1, NOT_UTF8)
        out = given.tmp / ("captions.jsonl" if command == "caption" else "out")
        before = names_under(given.tmp)

        def check(outcome: Outcome) -> None:
            assert names_under(given.tmp) == before

        return Prepared([command, photos, "--ckpt", given.checkpoint, "--out", out, *extra,
                         *FAST], ("caf\\xe9.png: the file name is not UTF-8 text",), check)

    return prepare


def _id_past_64_bits(given: Given) -> Prepared:
    """Item 13: a split whose image id is 2**70."""
    images = given.tmp / "images"
    images.mkdir()
    write_png(images / "a.png")
    data = write_karpathy(given.tmp / "split.json", [karpathy_record("a.png", 2**70, "train")])
    out = given.tmp / "f.h5"

    def check(outcome: Outcome) -> None:
        assert not out.exists()

    return Prepared(["prepare-features", "--data", data, "--images", images, "--out", out,
                     "--weights", "none", *TINY_ENCODER],
                    (str(data), "images[0] (a.png)", "field 'imgid' is 1180591620717411303424, "
                     "outside the 64-bit"), check)


def _temporary_of_a_killed_writer(given: Given) -> Prepared:
    """Item 14: the ``.NAME.*.tmp`` a ``caption --out`` killed while writing left; the next
    run's write removes it."""
    out = given.tmp / "captions.txt"
    stale = given.tmp / ".captions.txt.k1ll3d_x.tmp"
    stale.write_text("half the captions of a run killed with SIGKILL")

    def check(outcome: Outcome) -> None:
        assert out.is_file() and not stale.exists() and not leftover_temporaries(given.tmp)

    return Prepared(["caption", given.photos(1), "--ckpt", given.checkpoint, "--out", out,
                     *FAST], (), check)


def _empty_second_config(given: Given) -> Prepared:
    """Item 16: an empty second --config."""
    base = given.tmp / "base.yaml"
    base.write_text("trainer:\n  max_epochs: 1\n", encoding="utf-8")
    empty = given.tmp / "second.yaml"
    empty.write_text("", encoding="utf-8")
    return Prepared(["fit", "--config", base, "--config", empty],
                    (f"--config {empty}: holds no settings",))


def _no_training_batch(given: Given) -> Prepared:
    """Item 16: ``--trainer.limit_train_batches 0``: refused before the run folder is made."""
    from data_prep.features import FeatureCache

    runs = given.tmp / "runs"
    configs = Path(__file__).resolve().parents[1] / "configs"

    def check(outcome: Outcome) -> None:
        assert not runs.exists()

    return Prepared([
        "fit", "--config", configs / "demo_softmax.yaml",
        "--data.karpathy_json", given.data.karpathy_json,
        "--data.image_root", given.data.image_root, "--data.feature_cache", given.cache,
        "--data.image_size", "32",
        "--model.encoder_weights", FeatureCache(given.cache).encoder["weights"],
        "--trainer.limit_train_batches", "0", "--trainer.max_epochs", "1",
        "--trainer.logger.init_args.save_dir", runs,
    ], ("--trainer.limit_train_batches 0 trains on no batch, so the fit would save no "
        "checkpoint",), check)


def _negative_seed(given: Given) -> Prepared:
    """Item 16: ``rating-kit --seed -1``, refused before any image is captioned."""
    out = given.tmp / "kit"

    def check(outcome: Outcome) -> None:
        assert not out.exists()

    return Prepared(["rating-kit", given.photos(), "--ckpt", given.checkpoint, "--out", out,
                     "--seed", "-1", *FAST], ("--seed", "must be >= 0, got -1"), check)


def _jsonl_key_given_twice(given: Given) -> Prepared:
    """Item 16: a JSONL captions record giving a key twice (json would keep the last)."""
    photos = given.photos()
    captions = given.tmp / "captions.jsonl"
    captions.write_text('{"image": "p0.png", "captions": ["a dog"], "captions": ["a cat"]}\n'
                        '{"image": "p1.png", "captions": ["a red cat"]}\n', encoding="utf-8")
    out = given.tmp / "dataset.json"

    def check(outcome: Outcome) -> None:
        assert not out.exists()

    return Prepared(["prepare-dataset", "--captions", captions, "--images", photos,
                     "--out", out, "--on-error", "fail"],
                    ("captions.jsonl line 1", "gives the key 'captions' twice"), check)


def _output_name_near_the_limit(given: Given) -> Prepared:
    """Item 16: an output name of 254 bytes, whose temporary's name would pass 255."""
    out = given.tmp / ("c" * 250 + ".txt")

    def check(outcome: Outcome) -> None:
        assert out.is_file() and not leftover_temporaries(given.tmp)

    return Prepared(["caption", given.photos(1), "--ckpt", given.checkpoint, "--out", out,
                     *FAST], (), check)


def _score_argv(given: Given, out: Path) -> list:
    """``score`` of two captions against their references, into ``out``."""
    records = [karpathy_record(f"{i}.png", i, "test") for i in (5, 6)]
    references = write_karpathy(given.tmp / "refs.json", records)
    results = given.tmp / "results.json"
    results.write_text(json.dumps([{"image_id": 5, "caption": "a small picture"},
                                   {"image_id": 6, "caption": "a picture"}]), encoding="utf-8")
    return ["score", "--results", results, "--references", references, "--split", "test",
            "--metrics", "Bleu", "--out", out]


def _scores_named_near_the_limit(given: Given) -> Prepared:
    """Item 16: ``score --out`` of a 250-byte name, whose temporary's or lock's name would
    pass 255 bytes (score failed after computing its metrics)."""
    out = given.tmp / ("s" * 245 + ".json")

    def check(outcome: Outcome) -> None:
        assert json.loads(out.read_text(encoding="utf-8"))
        assert not leftover_temporaries(given.tmp)

    return Prepared(_score_argv(given, out), (f"wrote {out}",), check)


def _scores_named_past_the_limit(given: Given) -> Prepared:
    """Item 16: ``score --out`` of a 257-byte name, which no file can have: refused before
    scoring (its check of the output's folder met ENAMETOOLONG)."""
    out = given.tmp / ("s" * 252 + ".json")
    return Prepared(_score_argv(given, out), (f"{out}: file name too long",))


INTEGRITY_CASES: dict[str, IntegrityCase] = {
    **{f"{command}: a killed run's staging folder":
       IntegrityCase(4, 0, _staging_left_by_a_killed_run(command))
       for command in ("heatmaps", "gallery", "rating-kit")},
    "caption: a checkpoint failing its CRC-32": IntegrityCase(6, 2, _damaged_checkpoint),
    "fit: a feature cache with flipped bits": IntegrityCase(7, 2, _cache_with_flipped_bits),
    "prepare-features: encoder weights replaced after caching":
        IntegrityCase(8, 2, _weights_replaced_after_caching),
    "caption: a vocabulary word holding escape sequences":
        IntegrityCase(9, 2, _vocabulary_with_escapes),
    **{f"{command}: a split file naming ../secret/x.png":
       IntegrityCase(10, 2, _split_naming_an_outside_image(command))
       for command in ("prepare-features", "gallery", "rating-kit")},
    "runs: an alias bomb in config.yaml": IntegrityCase(11, 0, _hostile_run_folder(
        ALIAS_BOMB + "model:\n  output_attention: tvmax\n  output_attention_kwargs:\n"
        "    lam: *a9\n", None)),
    "runs: 100,000 nested [ in config.yaml": IntegrityCase(11, 0, _hostile_run_folder(
        "[" * 100_000, None)),
    "runs: a 10-million-character path in progress.json": IntegrityCase(11, 0, _hostile_run_folder(
        None, {"epochs_done": 1, "global_step": 2, "monitor": "val/CIDEr", "best_score": 0.5,
               "best_checkpoint": "/" + "a" * 10_000_000, "last_checkpoint": "/b"})),
    "fit: a --config of 100,000 nested [": IntegrityCase(11, 2, _deep_fit_config),
    "caption --format jsonl: a file name that is not UTF-8": IntegrityCase(
        12, 2, _not_utf8_name("caption", "--format", "jsonl")),
    **{f"{command}: a file name that is not UTF-8": IntegrityCase(
        12, 2, _not_utf8_name(command, *(["--n", "2"] if command == "rating-kit" else [])))
       for command in ("heatmaps", "gallery", "rating-kit")},
    "prepare-features: an image id of 2**70": IntegrityCase(13, 2, _id_past_64_bits),
    "caption --out: the temporary of a killed writer": IntegrityCase(
        14, 0, _temporary_of_a_killed_writer),
    "fit: an empty second --config": IntegrityCase(16, 2, _empty_second_config),
    "fit: --trainer.limit_train_batches 0": IntegrityCase(16, 2, _no_training_batch),
    "rating-kit: --seed -1": IntegrityCase(16, 2, _negative_seed),
    "prepare-dataset: a JSONL record giving a key twice": IntegrityCase(
        16, 2, _jsonl_key_given_twice),
    "caption --out: an output name of 254 bytes": IntegrityCase(
        16, 0, _output_name_near_the_limit),
    "score --out: an output name of 250 bytes": IntegrityCase(
        16, 0, _scores_named_near_the_limit, (pytest.mark.java,)),
    "score --out: an output name of 257 bytes": IntegrityCase(
        16, 2, _scores_named_past_the_limit),
}

# The items (or parts of one) that need a fault while the command runs, and the tests of each:
# item -> [(what, "tests/FILE.py::TEST"), ...].
INTEGRITY_COVERED_ELSEWHERE: dict[int, list[tuple[str, str]]] = {
    1: [("a second gallery, rating-kit, heatmaps or caption while the first holds --out",
         "tests/test_integrity_outputs.py::"
         "test_a_second_run_into_the_same_out_is_refused_and_touches_nothing"),
        ("a second fit into a --checkpoint.dirpath in use",
         "tests/test_integrity_fit.py::test_a_second_fit_into_a_checkpoint_folder_in_use_is_refused")],
    2: [("ulimit -f while fit writes last.ckpt",
         "tests/test_integrity_disk.py::"
         "test_a_fit_that_cannot_save_its_checkpoint_stops_in_one_line_and_resumes")],
    3: [("a full disk or ulimit -f in prepare-features",
         "tests/test_integrity_disk.py::"
         "test_prepare_features_refuses_a_cache_that_cannot_fit_before_encoding")],
    5: [("a copied run folder resumed with its own config.yaml (needs a trained run)",
         "tests/test_training_cli.py::test_a_copied_runs_folder_resumes_and_tests_its_own_run")],
    7: [("a cache row with a flipped bit, read as fit reads it",
         "tests/test_integrity_checksums.py::"
         "test_a_cache_row_with_a_flipped_bit_is_refused_naming_file_and_image"),
        ("a cache row rewritten without its checksum",
         "tests/test_integrity_checksums.py::"
         "test_a_cache_row_rewritten_without_its_checksum_is_refused"),
        ("a cache row moved to another image",
         "tests/test_integrity_checksums.py::test_a_cache_row_moved_to_another_image_is_refused")],
    12: [("standard output on a full device", "tests/test_integrity_stdout.py::"
          "test_stdout_on_a_full_device_is_one_line"),
         ("standard output closed", "tests/test_integrity_stdout.py::"
          "test_a_closed_stdout_is_one_line"),
         ("PYTHONIOENCODING=ascii", "tests/test_integrity_stdout.py::"
          "test_an_ascii_stdout_shows_what_it_cannot_hold_as_escapes")],
    14: [("SIGKILL of the process that started a JVM",
          "tests/test_integrity_children.py::test_a_jvm_dies_with_the_process_that_started_it"),
         ("a killed run's Java work folder",
          "tests/test_integrity_children.py::"
          "test_a_java_work_folder_of_a_killed_run_is_removed_by_the_next")],
    15: [("a METEOR JVM killed while score runs",
          "tests/test_integrity_children.py::"
          "test_score_names_meteor_in_one_line_when_its_jvm_dies_mid_score")],
    16: [("prepare-synthetic under ulimit -f (a child process)",
          "tests/test_robust_integrity.py::"
          "test_prepare_synthetic_on_a_full_disk_is_one_line_and_leaves_no_image"),
         ("Ctrl-C in a fit's first epoch (the demo's TVmax fit): one line, nothing to resume",
          "tests/test_training_cli.py::"
          "test_ctrl_c_stops_fit_with_status_130_and_says_how_to_resume"),
         ("a new run stopped before it trains leaves no run folder",
          "tests/test_training_cli.py::test_a_new_run_stopped_before_training_leaves_no_run_folder"),
         ("Ctrl-C while the demo trains a captioner",
          "tests/test_demo.py::test_ctrl_c_while_a_captioner_trains_stops_the_demo")],
}
