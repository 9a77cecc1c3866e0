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
