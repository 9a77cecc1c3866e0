"""A self-contained copy of a checkpoint, for sharing: what ``captioner export`` runs (the
copying is :func:`captioner.model.frozen_encoder.export_self_contained`). torch is imported when the
work starts, so that the command's options are read at once."""

from __future__ import annotations

from pathlib import Path

from captioner.reporting import report_error


def export_checkpoint(ckpt: Path, out: Path, overwrite: bool = False) -> int:
    """Write to ``out`` a copy of checkpoint ``ckpt`` that holds its frozen encoder's tensors;
    the exit status: 0, or 2 for a user error (one line).

    Args:
        ckpt: checkpoint to export.
        out: the self-contained checkpoint to write.
        overwrite: replace an existing --out file (default: refuse it).
    """
    from captioner.checkpointing import CheckpointError
    from captioner.model.encoder import EncoderWeightsError
    from captioner.model.frozen_encoder import export_self_contained
    from data_prep.paths import check_output_file

    try:
        check_output_file(out, [("CKPT", ckpt)], overwrite=overwrite)
        completed = export_self_contained(ckpt, out)
    except (CheckpointError, EncoderWeightsError, OSError, ValueError) as exc:
        return report_error("captioner export", exc)
    told = "with its frozen encoder put in" if completed else "(it held its encoder already)"
    print(f"wrote {out} {told}")
    return 0
