"""``captioner fit|validate|test``: LightningCLI over CaptioningModule and CaptionDataModule.

    captioner fit --config configs/coco_tvmax.yaml
    captioner fit --config configs/coco_tvmax.yaml --ckpt_path last       # resume
    captioner test --config configs/coco_tvmax.yaml --ckpt_path best     # the newest run's best
    captioner test --run_name coco_tvmax --ckpt_path best                # the same, by its name

What the CLI adds to Lightning's is in :mod:`captioner.training.cli`. Errors in the command
line, a config or a checkpoint print one line and exit with status 2 (CAPTIONER_DEBUG=1 shows
the traceback); Ctrl-C, and a DDP run whose other process went away, end with the line that
resumes the run (status 130, 1).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HELP = {
    "fit": "train a captioner from YAML configs (configs/*.yaml); --ckpt_path last resumes",
    "validate": "score a checkpoint on the validation split (BLEU-4, CIDEr) with its config",
    "test": "score a checkpoint on the test split (BLEU-4, CIDEr) with its config",
}
NEEDS_COMMAND_NAME = True

def main(argv: list[str]) -> int:
    from captioner.reporting import close_progress_bars, report_error
    from captioner.training.cli import Interrupted, PeerLost, build_cli, end_distributed

    command = f"captioner {argv[0]}"
    argv = _with_the_runs_config(argv)
    problem = _config_problem(argv)
    if problem is not None:
        return report_error(command, ValueError(problem))
    # LightningCLI warns when it is handed args while sys.argv also holds some; from the console
    # script they are the same words, so let it read sys.argv itself.
    args = None if list(argv) == sys.argv[1:] else list(argv)
    try:
        cli = build_cli(args, on_lost_process=_end_told(command))
    except (Interrupted, PeerLost) as exc:
        # A lost peer is said by every process that is left: the first may be the one that went.
        if isinstance(exc, PeerLost) or _first_process():
            close_progress_bars()
            print(f"{command}: {exc}", file=sys.stderr)
        return 130 if isinstance(exc, Interrupted) else 1
    except _user_errors() as exc:
        # Under DDP the first process, which met the same error, says it.
        return _report_refusal(exc, argv) if _first_process() else 2
    # Every rank: trainer.log_dir is a collective under DDP.
    summary = cli.run_summary() if argv[0] == "fit" else cli.evaluation_summary()
    if cli.trainer.is_global_zero and summary:
        print(summary)
    end_distributed()
    return 0


def _user_errors() -> tuple[type[Exception], ...]:
    """The errors that the command line, a config or a file the user named cause."""
    from argparse import ArgumentError

    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from captioner.model.encoder import EncoderWeightsError
    from captioner.training.cli import UserError

    return (UserError, OSError, ValueError, ArgumentError, MisconfigurationException,
            EncoderWeightsError)


def _config_problem(argv: list[str]) -> str | None:
    """What makes a ``--config`` of ``argv`` unusable that jsonargparse would not say in one
    line: a file over the limits of every settings file, or one holding no settings."""
    from captioner.training.command_line import config_files
    from data_prep.settings_files import SettingsLimitError, read_settings

    for config in config_files(argv):
        try:
            document = read_settings(config, "config")
        except SettingsLimitError as exc:
            return f"--config {exc}"
        except (OSError, ValueError):
            continue  # a config that cannot be read: the parser says why, naming the option
        if document is None:  # jsonargparse says "Unexpected config:" and nothing more
            return f"--config {config}: holds no settings (an empty YAML document)"
    return None


def _report_refusal(exc: Exception, argv: list[str]) -> int:
    """Report a user error of the command line ``argv`` in one line, naming the config file
    it is in where it is in one; status 2."""
    from captioner.reporting import report_error
    from captioner.training.command_line import config_files

    command, message, configs = f"captioner {argv[0]}", str(exc), config_files(argv)
    if isinstance(exc, UnicodeDecodeError) and configs:  # a config file that is not text
        return report_error(command, ValueError(
            f"not UTF-8 text ({exc.reason} at byte {exc.start})"),
            f"--config {', '.join(_unreadable(configs))}")
    if _from_config_files(message, argv) and configs:
        if "Problems parsing config" in message:
            configs = _unreadable(configs)
        return report_error(command, ValueError(_tidy(message, configs)),
                            f"--config {', '.join(configs)}")
    from captioner.commands.options import one_line_usage_error

    options = one_line_usage_error(_as_options(message, argv[0]))
    return report_error(command, exc if options == message else ValueError(options))


def _with_the_runs_config(argv: list[str]) -> list[str]:
    """``validate`` or ``test`` of a run by its name, ``--run_name R --ckpt_path best|last``
    without ``--config``: the config.yaml of R's newest version that holds checkpoints as the
    first config, so that nothing given to the fit is given again (that config.yaml names the
    data, the model and the runs folder, and the CLI takes the checkpoint from its run). The
    runs folder is ``--trainer.logger.init_args.save_dir`` where given, else ``runs``."""
    from captioner.training.command_line import config_files, option_values
    from captioner.training.folders import version_folders

    names, checkpoints = option_values(argv, "run_name"), option_values(argv, "ckpt_path")
    if (argv[0] == "fit" or config_files(argv) or not names or not checkpoints
            or checkpoints[-1] not in ("best", "last")):
        return argv
    root = Path((option_values(argv, "trainer.logger.init_args.save_dir") or ["runs"])[-1])
    for _, folder in reversed(version_folders(root, names[-1])):
        if (folder / "config.yaml").is_file() and (folder / "checkpoints").is_dir():
            return [argv[0], "--config", str(folder / "config.yaml"), *argv[1:]]
    return argv  # the CLI names what is missing


def _end_told(command: str):
    """What ends this process when a DDP process it started is lost: the line that says so and
    how to resume, status 1. Called from Lightning's observer thread while the main thread
    may wait in a collective for the lost process, so the process ends from there."""
    import os

    from captioner.reporting import close_progress_bars

    def end(message: str) -> None:
        close_progress_bars()
        print(f"{command}: {message}", file=sys.stderr, flush=True)
        os._exit(1)

    return end


def _first_process() -> bool:
    """Whether this process is the first (global rank 0) or the only one. Under DDP, Lightning
    starts the other ranks as copies of this command, which meet the same error or stop: one
    line from the first says it, not one from each."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    return rank_zero_only.rank == 0


def _as_options(message: str, subcommand: str) -> str:
    """A missing required key as the option that gives it: jsonargparse names it by its place
    in the parser ("the following arguments are required: test.data.karpathy_json")."""
    head, required, keys = message.partition("the following arguments are required: ")
    if not required:
        return message
    options = [f"--{key.removeprefix(f'{subcommand}.')}" for key in keys.split(", ")]
    return f"{head}{required}{', '.join(options)} (or a --config that sets them)"


def _tidy(message: str, configs: list[str]) -> str:
    """A parse error of a config file, with jsonargparse's repetition of a failed include cut
    off ('Parser key "data": Unable to load config 'X' - Parser key "data": Unable to load
    config "X"') and, when the included file is missing, where it was looked for (beside the
    config that includes it)."""
    head, _, tail = message.partition(" - ")
    if " ".join(tail.replace('"', "'").split()) == " ".join(head.replace('"', "'").split()):
        message = head.rstrip()
    included = re.search(r"Unable to load config '([^']+)'", message)
    if included is not None:
        places = [Path(config).parent / included.group(1) for config in configs]
        if not any(place.exists() for place in places):
            message += f": no such file ({', '.join(map(str, places))})"
    return message


def _from_config_files(message: str, argv: list[str]) -> bool:
    """Whether a parse error is in a config file rather than on the command line: a key the
    parser does not accept there (one misspelt on the command line is "unrecognized"), a file
    that is not valid YAML, a config or group file it includes (key "config", or "Unable to
    load config"), or a bad value that the command line did not give."""
    if any(words in message for words in ("does not accept option", "Problems parsing config",
                                          "Unable to load config")):
        return True
    from captioner.training.command_line import option_values

    key = re.search(r'Parser key "([^"]+)"', message)
    if key is None:
        return False
    if key.group(1) == "config":
        return True
    got = re.search(r"Got value: (.*)$", message)
    given = option_values(argv, key.group(1))
    return not given or (got is not None and got.group(1) not in given)


def _unreadable(configs: list[str]) -> list[str]:
    """The config files a parse error is in: those that are not readable YAML (all of them
    when each reads)."""
    import yaml

    unreadable = []
    for config in configs:
        try:
            yaml.safe_load(Path(config).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            unreadable.append(config)
    return unreadable or configs
