"""``captioner fit|validate|test``: LightningCLI over CaptioningModule and CaptionDataModule.

    captioner fit --config configs/coco_tvmax.yaml
    captioner fit --config configs/coco_tvmax.yaml --ckpt_path last       # resume
    captioner test --config configs/coco_tvmax.yaml --ckpt_path best     # the newest run's best
    captioner fit --config configs/coco_tvmax.yaml --print_config

Runs are written to runs/NAME/version_N/ (NAME: the config file's stem, or --run_name), with
the checkpoints in its checkpoints/ folder (see captioner.training_runs). "--ckpt_path last"
resumes the newest version of NAME that has a last.ckpt (or, with a run's own config.yaml as
--config, that run), in the same folder. The vocabulary
size and the image size are linked from the data to the model. The best checkpoint is chosen
on val/CIDEr (the checkpoint.* options), last.ckpt is written every epoch (and every
--last.every_n_train_steps steps when set). Several GPUs or nodes: --trainer.strategy ddp
--trainer.devices N --trainer.num_nodes M (Lightning's DDP).

User errors (missing files, malformed data, bad checkpoints, bad settings) print one line and
exit with status 2; set CAPTIONER_DEBUG=1 for the traceback. Ctrl-C stops a run after Lightning's
graceful shutdown with status 130 and one line saying what --ckpt_path last resumes from.
"""

from __future__ import annotations

import re
import sys

HELP = {
    "fit": "train a captioner from YAML configs (configs/*.yaml); --ckpt_path last resumes",
    "validate": "score a checkpoint on the validation split (BLEU-4, CIDEr) with its config",
    "test": "score a checkpoint on the test split (BLEU-4, CIDEr) with its config",
}
NEEDS_COMMAND_NAME = True

def main(argv: list[str]) -> int:
    from argparse import ArgumentError

    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from captioner.commands.options import report_error
    from captioner.model.encoder import EncoderWeightsError
    from captioner.training_cli import (
        Interrupted,
        UserError,
        build_cli,
        config_files,
        end_distributed,
    )

    # LightningCLI warns when it is handed args while sys.argv also holds some; from the console
    # script they are the same words, so let it read sys.argv itself.
    args = None if list(argv) == sys.argv[1:] else list(argv)
    try:
        cli = build_cli(args)
    except Interrupted as exc:
        print(f"captioner {argv[0]}: {exc}", file=sys.stderr)
        return 130
    except (UserError, OSError, ValueError, ArgumentError, MisconfigurationException,
            EncoderWeightsError) as exc:
        message, configs = str(exc), config_files(argv)
        # A key of a config file (a misspelt one on the command line is "unrecognized"), a
        # config file that is not valid YAML, or a bad value not given on the command line:
        # name the files.
        key = re.search(r'Parser key "([^"]+)"', message)
        given = {arg.split("=", 1)[0] for arg in argv}
        in_config = ("does not accept option" in message or "Problems parsing config" in message
                     or (key is not None and f"--{key.group(1)}" not in given))
        if "Problems parsing config" in message:
            configs = [c for c in configs if not _reads_as_yaml(c)] or configs
        context = f"--config {', '.join(configs)}" if in_config and configs else ""
        return report_error(f"captioner {argv[0]}", exc, context)
    if argv[0] == "fit":
        summary = cli.run_summary()  # every rank: trainer.log_dir is a collective under DDP
        if cli.trainer.is_global_zero:
            print(summary)
    end_distributed()
    return 0


def _reads_as_yaml(path: str) -> bool:
    """Whether the config file ``path`` is readable YAML (to name the one a parse error is in)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return True
