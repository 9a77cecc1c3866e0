"""Caption image files with a trained checkpoint and write the captions as text, JSON lines or
COCO results: what ``captioner caption`` runs. torch is imported when the work starts, so that
the command's options are read at once."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, TextIO

from captioner.model.decoding_options import DecodingOverrides, apply_overrides
from captioner.reporting import report_error
from data_prep.settings_files import check_options_at_least
from data_prep.text import check_utf8_names, printable
from data_prep.wording import counted

OutputFormat = Literal["text", "jsonl", "coco"]
FORMATS: tuple[str, ...] = OutputFormat.__args__
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
PROG = "captioner caption"


def caption_images(
    inputs: Sequence[Path],
    ckpt: Path,
    format: OutputFormat = "text",
    out: Path | None = None,
    overwrite: bool = False,
    decoding: DecodingOverrides | None = None,
    batch_size: int = 16,
    device: str | None = None,
    progress: bool = True,
) -> int:
    """Caption the image files and folders ``inputs`` with checkpoint ``ckpt``; the exit
    status: 0, 1 when an image could not be read (named on stderr, the others captioned),
    2 for a user error (said in one line before any image is captioned), 130 on Ctrl-C.

    Args:
        inputs: image files and folders of images.
        ckpt: trained checkpoint (.ckpt), as 'captioner fit' writes it.
        format: output format: text, jsonl or coco.
        out: output file (default: standard output); checked before any image is captioned,
            written atomically.
        overwrite: replace an existing --out file (default: refuse it).
        decoding: decoding options; each not given is the checkpoint's own.
        batch_size: images per batch.
        device: torch device: cpu, cuda, cuda:1, ... (default: cuda when available, else cpu).
        progress: show progress bars.
    """
    with contextlib.ExitStack() as claim:  # the --out file, held until the work ends
        try:
            check_options_at_least([("batch_size", batch_size, 1)])
            job = _CaptionJob.open(inputs, ckpt, format, out, overwrite, decoding, device, claim)
        except (OSError, ValueError) as exc:
            return report_error(PROG, exc)
        return job.run(batch_size, progress)


class _CaptionJob:
    """The images, the captioner with its decoding options and the output of one run."""

    def __init__(self, paths, captioner, options, output_format, out) -> None:
        self.paths, self.captioner, self.options = paths, captioner, options
        self.format, self.out = output_format, out
        self.failures: list[Path] = []
        self.records = 0
        self.interrupted = False
        self.earlier = out is not None and out.exists()  # replaced only by a whole result

    @classmethod
    def open(cls, inputs, ckpt, output_format, out, overwrite, decoding, device, claim
             ) -> _CaptionJob:
        """Everything checked before any image is captioned: the inputs, --out (claimed),
        the checkpoint and the decoding options. Raises OSError or ValueError."""
        from captioner.inference.image_files import collect_images
        from captioner.inference.pipeline import open_captioner
        from data_prep.output_folders import claimed_output
        from data_prep.paths import check_output_file

        if output_format not in FORMATS:
            raise ValueError(f"unknown format {output_format!r}; choose from {', '.join(FORMATS)}")
        paths = collect_images(inputs)
        if output_format != "text":
            check_utf8_names(paths, f"the {output_format} output (JSON)")
        if out is not None:
            out = Path(out)
            claim.enter_context(claimed_output(out, "captions", lambda: check_output_file(
                out, [("checkpoint", ckpt), *(("image", path) for path in paths)],
                overwrite=overwrite)))
        captioner = open_captioner(ckpt, device)
        options = apply_overrides(captioner.decoding, decoding)
        return cls(paths, captioner, options, output_format, out)

    def run(self, batch_size: int, progress: bool) -> int:
        """Caption and write; the exit status."""
        try:
            if self.out is None:
                self._write(sys.stdout, batch_size, progress)
            else:
                from data_prep.atomic import atomic_write

                try:
                    with atomic_write(self.out) as handle:
                        self._write(handle, batch_size, progress)
                except OSError as exc:
                    return report_error(PROG, exc, f"cannot write {self.out}")
        except KeyboardInterrupt:
            return self._interrupted_before_writing()
        return self._status()

    def _write(self, out: TextIO, batch_size: int, progress: bool) -> None:
        """Write every record to ``out``; on Ctrl-C, those done so far, unless none is done
        or --out held an earlier file (KeyboardInterrupt raised again)."""
        from tqdm import tqdm

        from captioner.inference.image_files import coco_image_ids

        ids, from_names = (coco_image_ids(self.paths) if self.format == "coco" else ([], True))
        if not from_names:
            print(f"{PROG}: not every file name is a distinct numeric id; COCO image ids are "
                  "the 1-based positions in the input list (unreadable images counted too) "
                  'and (each record names its image in "file_name")', file=sys.stderr)
        results = []
        captions = self.captioner.caption_files(
            self.paths, self.options, batch_size=batch_size,
            progress=progress and len(self.paths) > 1)
        try:
            for index, (result, caption) in enumerate(captions):
                if caption is None:
                    self.failures.append(result.path)
                    # Above the progress bar, not glued to its line.
                    tqdm.write(f"{PROG}: skipped {result.error}", file=sys.stderr)
                elif self.format == "coco":
                    results.append(coco_record(ids[index], caption.text, result.path))
                else:
                    out.write(self._record(result.path, caption) + "\n")
                    out.flush()
                self.records += caption is not None
        except KeyboardInterrupt:
            if self.records == 0 or self.earlier:
                raise  # an earlier --out file is not replaced by an empty or partial one
            self.interrupted = True  # keep the records done so far
        if self.format == "coco":
            json.dump(results, out, ensure_ascii=False)
            out.write("\n")

    def _record(self, path: Path, caption) -> str:
        if self.format == "jsonl":
            from captioner.inference.pipeline import jsonl_record

            record = jsonl_record(path, caption, self.captioner.output_attention_name)
            return json.dumps(record, ensure_ascii=False)
        return f"{str(path).translate(_ESCAPES)}\t{printable(caption.text)}"

    def _interrupted_before_writing(self) -> int:
        if self.records and self.earlier:
            print(f"{PROG}: interrupted; the earlier {self.out} is left as it was (the "
                  f"{counted(self.records, 'caption')} made are not written)", file=sys.stderr)
            return 130
        kept = "" if self.out is None else f"; {self.out} was not written"
        print(f"{PROG}: interrupted before any image was captioned{kept}", file=sys.stderr)
        return 130

    def _status(self) -> int:
        if self.interrupted:
            where = "standard output" if self.out is None else str(self.out)
            print(f"{PROG}: interrupted; {counted(self.records, 'caption')} of "
                  f"{counted(len(self.paths), 'image')} written to {where}", file=sys.stderr)
            return 130
        if self.failures:
            print(f"{PROG}: {len(self.failures)} of {len(self.paths)} images could not be read: "
                  + ", ".join(map(str, self.failures)), file=sys.stderr)
            return 1
        return 0


def coco_record(image_id: int, text: str, path: Path) -> dict:
    """A COCO results record that also names its image in "file_name" (the path as given), so
    that `captioner score` can check that the references give ``image_id`` to the same file (a
    converted dataset numbers its images otherwise), and a caption whose id is a position stays
    tied to its image: the ids skip the unreadable images' positions, and a text output of the
    same inputs has no line for those images. coco-caption reads the records' other fields
    as it reads these, and scores by image_id and caption alone."""
    return {"image_id": image_id, "caption": text, "file_name": str(path)}

