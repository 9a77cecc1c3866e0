"""The LightningCLI of ``captioner fit|validate|test`` (and of the demo's training).

Lightning's CLI over :class:`CaptioningModule` and :class:`CaptionDataModule`, with named run
folders (``runs/NAME/version_N``, :mod:`captioner.training.runs`), ``--ckpt_path last|best``
of a run, checkpoints read as untrusted data before jsonargparse sees their hyperparameters,
and one-line errors (:class:`UserError`). Its Trainer is :mod:`captioner.training.trainer`'s;
what it reads of the command line as written (which config set which key) is
:mod:`captioner.training.command_line`'s.
"""

from __future__ import annotations

import logging
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from shlex import quote

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.fabric.utilities.seed import seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from captioner.checkpointing import HYPERPARAMETERS_KEY, load_safely, stored_vocabulary
from captioner.features.cache_check import CACHE_SETTINGS, check_feature_cache
from captioner.model.hyperparameters import hparams_from_checkpoint
from captioner.training.command_line import (
    KEPT_DATA_KEYS,
    first_config,
    given_options,
    model_keys_given,
    option_a_config_replaces,
    option_values,
)
from captioner.training.datamodule import CaptionDataModule
from captioner.training.folders import version_number
from captioner.training.module import LOGGED_METRICS, CaptioningModule
from captioner.training.runs import (
    LAST_NAME,
    PROGRESS_NAME,
    BestCheckpoint,
    LastCheckpoint,
    RunInUse,
    RunLock,
    SaveConfigOnceRestored,
    WorkBegun,
    claim_evaluation_folder,
    hold_metrics_for_resume,
    last_checkpoint,
    latest_resumable,
    put_back_held_metrics,
    read_progress,
    recorded_checkpoint,
    remove_interrupted_writes,
    remove_unbegun_run,
    restore_problem,
)
from captioner.training.stops import TellLostProcesses
from captioner.training.trainer import Trainer
from data_prep.features import FeatureCache
from data_prep.locks import let_go
from data_prep.paths import check_output_dir
from data_prep.wording import counted, first_names

CHECKPOINT_DEFAULTS = {
    "checkpoint.monitor": "val/CIDEr",
    "checkpoint.mode": "max",
    "checkpoint.save_last": False,  # last.ckpt is LastCheckpoint's, written every epoch
    "checkpoint.filename": "best-epoch{epoch:02d}-cider{val/CIDEr:.4f}",
    "checkpoint.auto_insert_metric_name": False,
    # A best checkpoint's name holds its epoch and score: in the run's own folder (a fit refuses
    # one holding another run's checkpoints) the same name is this run's, written again by a
    # resume that replays the epoch, not a file to keep beside it as -v1.
    "checkpoint.enable_version_counter": False,
}
TRAINER_DEFAULTS = {
    "plugins": {"class_path": "captioner.checkpointing.AtomicCheckpointIO"},
    "logger": {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": "runs"},
    },
}
_DEFAULT_LOGGER_NAME = "lightning_logs"


_CSV_LOGGERS = ("lightning.pytorch.loggers.CSVLogger",
                "lightning.pytorch.loggers.csv_logs.CSVLogger")
_RUN_LOGGER = "captioner.training.runs.RunLogger"
_NAMED_CHECKPOINTS = ("last", "best")


# torch.set_float32_matmul_precision's settings; the first (exact float32) is the default.
MATMUL_PRECISIONS = ("highest", "high", "medium")


class UserError(ValueError):
    """A problem with the command line, a config or a file the user named."""


class Interrupted(Exception):
    """A run stopped by Ctrl-C, after Lightning's graceful shutdown; the message says what is
    left and how to go on."""


class PeerLost(Exception):
    """A distributed run stopped because another of its processes went away (killed, out of
    memory, its node lost); the message says which error told and how to resume."""


class CaptionerCLI(LightningCLI):
    """LightningCLI with named run folders, safe ``--ckpt_path`` and ``last``/``best``."""

    def __init__(self, *args, on_lost_process: Callable[[str], None] | None = None,
                 **kwargs) -> None:
        # A DDP process started here that ends with an error, told "another process of this
        # fit stopped (...); how to resume" (lightning_stops.TellLostProcesses).
        self._on_lost_process = on_lost_process
        # The run name comes from the first --config of the command line, which the parsed
        # config no longer tells apart from the configs it includes.
        given = kwargs.get("args")
        self._args = sys.argv[1:] if given is None else list(given)
        if kwargs.get("run", True):
            self._args = self._args[1:]  # the sub-command
        self._first_config = first_config(self._args)
        self._resume_version: int | str | None = None  # the version --ckpt_path last picks
        self._ckpt_path: str | None = None  # --ckpt_path, resolved and checked
        self._checkpoint_step = 0  # global step of the --ckpt_path checkpoint
        self._resumed_run: Path | None = None  # the run folder fit resumes into
        self._new_root: Path | None = None  # the runs folder, when this command makes it
        self._made_folder: Path | None = None  # the log folder this command made (rank 0)
        self._work = WorkBegun()  # whether the command's work has begun (before_fit, _validate)
        # Settings the run's config.yaml records as given, not as resolved (before_fit).
        self._recorded: dict[str, object] = {}
        self._version_given = False  # the logger's version is named (a resume, an option)
        self._logger_class: str | None = None  # the CSVLogger class_path RunLogger replaces
        self._run_lock: RunLock | None = None  # fit's hold on its run folder (before_fit)
        # fit's hold on a checkpoint folder outside its run (--checkpoint.dirpath; before_fit)
        self._checkpoints_lock: RunLock | None = None
        self._made_checkpoint_folder: Path | None = None  # to remove if the fit leaves it empty
        self._evaluated_run: Path | None = None  # the run whose checkpoint validate/test score
        self._evaluation_hold: int | None = None  # their hold on their folder in that run
        if "trainer_defaults" in kwargs:
            # The logger's name is the run's (--run_name, else the first config's stem), so
            # that --print_config says where the run goes, not Lightning's "lightning_logs".
            name = (option_values(self._args, "run_name") or [self._default_run_name()])[-1]
            kwargs["trainer_defaults"] = _named_logger(kwargs["trainer_defaults"], name)
        # Seeded quietly before the model and the data are built: a setting refused while
        # they are built is then the command's one line, not "Seed set to N" and the refusal;
        # the seed is told once they stand (after_instantiate_classes).
        self._seed_log = logging.getLogger(seed_everything.__module__)
        told, self._seed_log.disabled = self._seed_log.disabled, True
        ended = False
        try:
            super().__init__(*args, **kwargs)
            ended = True
        except KeyboardInterrupt:
            raise Interrupted(self._after_interrupt()) from None
        except SystemExit:
            # Lightning ends a run stopped by Ctrl-C with exit(1), after its graceful shutdown.
            trainer = getattr(self, "trainer", None)
            if trainer is None or not trainer.interrupted:
                raise
            raise Interrupted(self._after_interrupt()) from None
        except RuntimeError as exc:
            told_by = _peer_loss(exc)
            if told_by is None:
                raise
            raise PeerLost(self._lost_process(told_by)) from None
        finally:
            self._seed_log.disabled = told
            if not ended:
                self._undo_unbegun()
            self._let_go()

    def _let_go(self) -> None:
        """Release the command's holds on its folders once it has ended, however: Lightning
        calls no teardown hook when a fit stops on an exception (Ctrl-C too), and the
        callbacks' on_exception, which still write into the run, come first."""
        for lock in (self._run_lock, self._checkpoints_lock):
            if lock is not None:
                lock.release()
        made = self._made_checkpoint_folder
        if made is not None and made.is_dir() and not any(made.iterdir()):
            made.rmdir()  # a fit refused, or stopped, before its first checkpoint
        if self._evaluation_hold is not None:
            let_go(self._evaluation_hold)

    def _undo_unbegun(self) -> None:
        """When the command stopped before its work began (refused, or failed before its
        first training step or its scores), remove the log folder it made, and give a
        refused resume back its metrics.csv (first process: the one that wrote them)."""
        if rank_zero_only.rank != 0 or self._work.begun:
            return
        if self._resumed_run is not None:
            put_back_held_metrics(self._resumed_run)
        remove_unbegun_run(self._made_folder, self._new_root)

    # LightningCLI hook: the model, the data and the trainer stand.
    def after_instantiate_classes(self) -> None:
        config = self._subcommand_config()
        self._seed_log.disabled = False
        seed = config.get("seed_everything")
        if seed is not None and seed is not False:
            rank_zero_info(f"Seed set to {seed}")
        if self.subcommand in ("fit", "validate", "test"):
            tell = self._on_lost_process
            self.trainer.callbacks.append(TellLostProcesses(
                lambda told: tell(self._lost_process(told)) if tell is not None else None))
        logger = config.trainer.get("logger")
        if self._logger_class is not None:
            logger.class_path = self._logger_class  # what the run's config.yaml records

    def _subcommand_config(self):
        subcommand = self.config.get("subcommand")
        return self.config[subcommand] if subcommand else self.config

    def _lost_process(self, told: str) -> str:
        """What a process of a DDP run says when another went away, ``told`` saying how it
        learnt it, with the command that resumes a fit."""
        subcommand = getattr(self, "subcommand", None)
        resume = self._resume_advice() if subcommand == "fit" else None
        return (f"another process of this {subcommand} stopped ({told})"
                + (f"; {resume}" if resume else ""))

    def _after_interrupt(self) -> str:
        if getattr(self, "subcommand", None) != "fit" or getattr(self, "trainer", None) is None:
            return "interrupted"
        resume = self._resume_advice()
        if resume is None:
            return (f"interrupted before the first {LAST_NAME} (written at the end of every "
                    "epoch): nothing to resume")
        return f"interrupted; {resume}"

    def _resume_advice(self) -> str | None:
        """The command that resumes this fit from its last.ckpt; None before the first."""
        folder = Path(self.best_callback.dirpath or ".")
        if not (folder / LAST_NAME).is_file():
            return None
        done = read_progress(folder).get("epochs_done", 0)
        # The run's own config.yaml (written once the fit started, before any last.ckpt) with
        # --ckpt_path last resumes this run whatever the command was: the same command would
        # resume another run if its --config was an earlier run's config.yaml.
        config = quote(str(folder.parent / "config.yaml"))  # to paste into a shell as it is
        return (f"captioner fit --config {config} --ckpt_path last resumes from "
                f"{folder / LAST_NAME} (epochs done: {done})")

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(BestCheckpoint, "checkpoint")
        parser.set_defaults(CHECKPOINT_DEFAULTS)
        parser.add_lightning_class_args(LastCheckpoint, "last")
        parser.add_argument(
            "--run_name", type=str | None, default=None,
            help="runs/NAME/version_N folder name (default: the first config file's stem)",
        )
        parser.add_argument(
            "--float32_matmul_precision", choices=MATMUL_PRECISIONS, default=MATMUL_PRECISIONS[0],
            help="torch.set_float32_matmul_precision: 'high' lets float32 matrix products use "
            "TF32 tensor cores on NVIDIA GPUs (Ampere and later), faster and less exact",
        )
        parser.link_arguments("data.image_size", "model.image_size")
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")

    # LightningCLI hook: parses the command line into self.config.
    def parse_arguments(self, parser, args) -> None:
        replaced = option_a_config_replaces(self._args)
        if replaced is not None:
            raise UserError(replaced)
        super().parse_arguments(parser, args)
        self._read_ckpt_path()

    def _read_ckpt_path(self) -> None:
        """Resolve ``--ckpt_path`` (``last``, ``best``), read the checkpoint as untrusted data
        and put its hyperparameters, checked as plain data against the model's constructor,
        into the config. Lightning would read them after this hook and hand them to
        jsonargparse as they are (which imports any ``class_path`` they name), so the config
        holds no ckpt_path until the classes are built (before_instantiate_classes)."""
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        ckpt_path = config.get("ckpt_path")
        if ckpt_path is None:
            if subcommand in ("validate", "test"):
                # Lightning would score the untrained model of the config, in a new run folder.
                raise UserError(f"{subcommand} scores a trained model: give --ckpt_path best, "
                                "last or a checkpoint file")
            return
        if ckpt_path in _NAMED_CHECKPOINTS:
            ckpt_path = self._resolve_named(subcommand, config, ckpt_path)
        path = Path(ckpt_path)
        if not path.exists():
            raise UserError(f"--ckpt_path {path}: no such checkpoint file")
        checkpoint = load_safely(path)
        problem = restore_problem(checkpoint, resume=subcommand == "fit")
        if problem is not None:
            raise UserError(f"--ckpt_path {path}: {problem}")
        if subcommand == "fit":
            _refuse_a_finished_training(checkpoint, config.trainer, path)
        hparams = hparams_from_checkpoint(checkpoint.get(HYPERPARAMETERS_KEY, {}), path)
        stored_vocabulary(checkpoint, hparams, path)  # as caption reads it
        self._checkpoint_step = int(checkpoint.get("global_step", 0))
        given = {}
        for key, source in model_keys_given(self._args).items():
            while key not in config and "." in key:  # a key inside a dict setting
                key = key.rsplit(".", 1)[0]
            given[key] = (config[key], source)
        self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
        config = self.config[subcommand]
        for key, name in KEPT_DATA_KEYS.items():
            if key not in given and hparams.get(name) is not None:
                config[key] = config[f"model.{name}"] = hparams[name]
        for key, (value, source) in given.items():
            trained = hparams.get(KEPT_DATA_KEYS[key]) if key in KEPT_DATA_KEYS else config[key]
            if key == "model.decoding" or key.startswith("model.decoding."):
                config[key] = value  # decoding only: the user's, not the checkpoint's
            elif trained is not None and trained != value:
                setting = f"--{key} {value}" if source is None else f"{source} sets {key}: {value}"
                advice = (f"leave --{key} out" if source is None else
                          "give the config it was trained with, such as its run's config.yaml")
                raise UserError(
                    f"{setting}, but {path} was trained with {trained}, and a model loaded "
                    f"from a checkpoint keeps its hyperparameters ({advice}; model.decoding.* "
                    "may change)"
                )
        # An evaluation's config.yaml names the checkpoint it scored as Lightning names its own
        # (an absolute path): a relative one would lead elsewhere, or nowhere, from another
        # folder. (A fit's records none: SaveConfigOnceRestored.)
        self._ckpt_path = str(path.resolve())
        config["ckpt_path"] = None

    def _resolve_named(self, subcommand: str, config, which: str) -> Path:
        """``last`` / ``best`` of this config's run (the newest, or the one whose config.yaml
        it is; without a logger, of the checkpoint folder); fit resumes into that run."""
        if subcommand == "fit" and which == "best":
            raise UserError("--ckpt_path best: fit resumes from 'last' or a checkpoint file")
        if config.trainer.get("logger") is False:
            last = _loggerless_last(config, which)
        else:
            last = self._run_last_of(subcommand, config, which)
        if subcommand == "fit" or which == "last":
            return last
        best = recorded_checkpoint(last.parent, read_progress(last.parent).get("best_checkpoint"))
        if best is None or not best.is_file():
            raise UserError(f"--ckpt_path best: {last.parent} names no existing best checkpoint")
        return best

    def _run_last_of(self, subcommand: str, config, which: str) -> Path:
        """The last.ckpt of the run that ``--ckpt_path last|best`` names (see
        :meth:`_resolve_named`); for fit, the version it resumes into is kept."""
        root = Path(_logger_args(config).get("save_dir") or "runs")
        name = self._run_folder_name(config)
        own = self._own_run()
        init_args = getattr(config.trainer.get("logger"), "init_args", None)
        if own is not None and init_args is not None:
            # A run is the folder its config.yaml is in, wherever the runs folder was moved
            # or copied to, whatever the file records.
            root, name = own.parent.parent, own.parent.name
            init_args["save_dir"], init_args["name"] = str(root), name
            version = version_number(own)
            found = (own.name if version is None else version), _run_last(own, which)
        elif (version := _logger_args(config).get("version")) is not None:
            found = _version_run(root, name, version, which)
        else:
            found = latest_resumable(root, name)
        if found is None:
            # 'best' is read from the progress.json beside the newest run's last.ckpt.
            what = LAST_NAME if which == "last" else f"best checkpoint (nor a {LAST_NAME})"
            named = sorted(folder.name for folder in (root / name).glob("*/")
                           if version_number(folder) is None and last_checkpoint(folder))
            remedy = ("train first (without --ckpt_path) or give a checkpoint file" if not named
                      else f"versions named with --trainer.logger.init_args.version have one "
                      f"({first_names(named, 3)}): name the one meant")
            raise UserError(f"--ckpt_path {which}: no version_N run of {name!r} has a {what} "
                            f"under {root / name}; {remedy}")
        version, last = found
        if subcommand == "fit":
            self._resume_version = version
        return last

    def _own_run(self) -> Path | None:
        """The run folder whose own ``config.yaml`` is the first --config (a ``version_N``
        folder, or one whose checkpoints a fit marked with its progress.json), unless the
        command line names the run itself (its runs folder, name or version)."""
        if not self._first_config or Path(self._first_config).name != "config.yaml":
            return None
        if any(option.key == "run_name" or option.key.startswith("trainer.logger")
               for option in given_options(self._args)):
            return None
        folder = Path(self._first_config).resolve().parent
        here = Path.cwd().resolve()
        if folder.is_relative_to(here) and len(folder.relative_to(here).parts) >= 3:
            folder = folder.relative_to(here)  # printed as runs/NAME/version_N, as a new run's
        checkpoints = folder / "checkpoints"
        if checkpoints.is_dir() and (version_number(folder) is not None
                                     or (checkpoints / PROGRESS_NAME).is_file()):
            return folder
        return None

    def before_instantiate_classes(self) -> None:
        subcommand = self.config.get("subcommand")
        config = self._subcommand_config()
        if self._ckpt_path is not None:
            config["ckpt_path"] = self._ckpt_path  # held back from Lightning (_read_ckpt_path)
        for key in ("optimizer", "lr_scheduler"):
            # Lightning's options, kept so that the runs' config.yaml (which give them null)
            # still parse: given, they replaced the model's Adam and its decay without a word,
            # while the run's config.yaml still gave the model's settings.
            if config.get(key) is not None:
                raise UserError(f"--{key}: the optimizer and its schedule are the model's: set "
                                "model.lr, model.betas, model.lr_decay and model.lr_decay_after")
        if subcommand == "fit" and config.checkpoint.get("monitor") is not None:
            _check_monitor(config.checkpoint)
            _name_best_after_monitor(config.checkpoint)
        torch.set_float32_matmul_precision(
            config.get("float32_matmul_precision") or MATMUL_PRECISIONS[0]
        )
        cache = config.data.get("feature_cache")
        if cache:
            # Before the model is built: building it loads the configured encoder weights,
            # which may be missing (offline) when the cache needs other weights anyway.
            options = [*CACHE_SETTINGS.values(), "model.encoder_trainable"]
            check_feature_cache({option: config[option] for option in options},
                                FeatureCache(cache), checkpoint=config.get("ckpt_path"))
        logger = config.trainer.get("logger")
        init_args = getattr(logger, "init_args", None)
        if init_args is None or "name" not in init_args:
            return
        init_args["name"] = self._run_folder_name(config)
        root = check_output_dir(init_args.get("save_dir") or ".")  # one line, not an errno
        self._new_root = None if root.exists() else root
        if "version" not in init_args:
            return
        version = init_args["version"]
        if subcommand == "fit" and isinstance(version, str) and (
                version in ("", ".", "..") or Path(version).name != version):
            # runs/NAME/V must be one folder of NAME's, where runs and resumes look for it.
            raise UserError(f"--trainer.logger.init_args.version {version!r}: a version names "
                            "one folder (no '/', '.' or '..')")
        self._recorded["trainer.logger.init_args.version"] = version  # as given
        if self._resume_version is not None:
            init_args["version"] = self._resume_version
        ckpt_path = config.get("ckpt_path")
        if subcommand in ("validate", "test") and ckpt_path:
            self._evaluated_run = _log_beside_the_run(init_args, Path(ckpt_path), subcommand)
            if self._evaluated_run is None:
                # A checkpoint from outside the runs gets a new version, also when --config is
                # a run's config.yaml that names its version: the logger would replace that
                # run's config.yaml, hparams.yaml and metrics.csv with the test's.
                init_args["version"] = None
            # They log into version_N/<subcommand>/, so the best-checkpoint callback restored
            # from the run warns that its folder changed: true, and of no use to them.
            warnings.filterwarnings("ignore", message=r"The dirpath has changed from")
        elif ckpt_path and init_args["version"] is not None:
            # Resuming into an existing run folder (also from a resumed run's config.yaml): a
            # version_N given with a checkpoint, or a named version with a checkpoint of its own
            # (a named version with another's checkpoint, or a version not made yet, is a new
            # run that starts from it).
            version = init_args["version"]
            run = Path(init_args["save_dir"]) / init_args["name"] / (
                f"version_{version}" if isinstance(version, int) else str(version))
            if run.is_dir() and (isinstance(version, int)
                                 or Path(ckpt_path).resolve().parent.parent == run.resolve()):
                self._resumed_run = run
        self._version_given = init_args["version"] is not None
        if logger.class_path in _CSV_LOGGERS:
            # Lightning's CSVLogger picks a new version_N racing with other runs of the name.
            self._logger_class, logger.class_path = logger.class_path, _RUN_LOGGER
        if (subcommand and self._evaluated_run is not None and rank_zero_only.rank == 0
                and not config.trainer.get("fast_dev_run")):
            self._claim_evaluation_folder(init_args)

    def before_fit(self) -> None:
        if self.trainer.limit_train_batches == 0:
            # Lightning skips training without a word: a run folder without a checkpoint.
            raise UserError("--trainer.limit_train_batches 0 trains on no batch, so the fit "
                            "would save no checkpoint; give 1 or more batches, or a fraction "
                            "above 0")
        if self._resumed_run is not None:
            self._work.resumed = (self._resumed_run, self._checkpoint_step)
        self.trainer.callbacks.append(self._work)
        for callback in self.trainer.callbacks:
            if isinstance(callback, SaveConfigOnceRestored):
                callback.recorded = {**self._recorded, "ckpt_path": None}
        if self.trainer.is_global_zero:
            if self._checkpoints_outside_the_run():
                self._hold_checkpoint_folder()
            if (not self._subcommand_config().get("ckpt_path")
                    and self._checkpoints_outside_the_run()):
                # Before a version folder is made for a fit that will not start.
                _refuse_earlier_checkpoints(self._checkpoint_folder())
            if self.trainer.logger is None and not self._resumes_its_folder():
                # Without a logger the run folder is default_root_dir (the working directory).
                _refuse_replacing(Path(self.trainer.default_root_dir) / "config.yaml")
            named = None
            folder = self._resumed_run or self._new_version()
            if folder is None:
                folder = named = self._named_version()
            if folder is not None:
                try:
                    self._run_lock = RunLock(folder)
                except RunInUse as exc:
                    raise UserError(str(exc)) from None  # names the run, however it was given
            if named is not None:  # after the lock, which names a fit training there now
                _refuse_an_earlier_run(named)
                if not any(named.iterdir()):
                    self._made_folder = named  # made now, or left empty: this fit's
            if self._resumed_run is not None:
                hold_metrics_for_resume(self._resumed_run)
                removed = remove_interrupted_writes(
                    [self._resumed_run, self._checkpoint_folder()])
                if removed:
                    print(f"captioner fit: removed {counted(len(removed), 'file')} of a write "
                          f"that was interrupted: {first_names([p.name for p in removed], 3)}",
                          file=sys.stderr)

    def _hold_checkpoint_folder(self) -> None:
        """Hold the checkpoint folder outside the run (--checkpoint.dirpath) while the fit
        trains: two fits started together into one would both pass the check for earlier
        checkpoints and write one last.ckpt, which would hold only one of the two models."""
        folder = self._checkpoint_folder()
        if not folder.exists():
            folder.mkdir(parents=True)
            self._made_checkpoint_folder = folder
        try:
            self._checkpoints_lock = RunLock(folder)
        except RunInUse:
            raise UserError(f"{folder}: another fit is writing its checkpoints there now "
                            "(--checkpoint.dirpath); give this one another folder, or wait for "
                            "it to end") from None

    def _resumes_its_folder(self) -> bool:
        """Whether this fit resumes from a checkpoint of the folder it writes its checkpoints
        to (:meth:`_checkpoint_folder`): the run there goes on."""
        config = self._subcommand_config()
        ckpt_path = config.get("ckpt_path")
        return bool(ckpt_path) and (Path(ckpt_path).resolve().parent
                                    == self._checkpoint_folder().resolve())

    def _checkpoints_outside_the_run(self) -> bool:
        """Whether the checkpoints go to a folder of their own, which an earlier run may have
        filled: --checkpoint.dirpath, or ./checkpoints without a logger's run folder (a new
        version's is new; a named version's is checked as a run)."""
        return (bool(self.best_callback.dirpath)
                or getattr(self.trainer.logger, "save_dir", None) is None)

    def _checkpoint_folder(self) -> Path:
        """The folder a fit writes its checkpoints to, as Lightning's ModelCheckpoint picks it:
        --checkpoint.dirpath, else the logger's run folder, else (--trainer.logger false)
        the trainer's default_root_dir, each with ``checkpoints/``."""
        if self.best_callback.dirpath:
            return Path(self.best_callback.dirpath)
        root = _logger_folder(self.trainer.logger) or Path(self.trainer.default_root_dir)
        return root / "checkpoints"

    def before_validate(self) -> None:
        if self.trainer.is_global_zero and self._evaluated_run is None:
            self._new_version()
        self.trainer.callbacks.append(self._work)

    before_test = before_validate

    def _claim_evaluation_folder(self, init_args) -> None:
        """Give validate / test of a run's checkpoint the first folder beside the run that no
        earlier or running evaluation holds (:func:`claim_evaluation_folder`), held until the
        command ends; the config.yaml written into it records the folder it is in. The other
        DDP processes keep ``version_N/<subcommand>``: they write nothing."""
        name, self._evaluation_hold = claim_evaluation_folder(self._evaluated_run,
                                                              self.config.subcommand)
        init_args["version"] = f"{self._evaluated_run.name}/{name}"
        folder = self._evaluated_run / name
        if not any(folder.iterdir()):  # made now, or left empty: this command's
            self._made_folder = folder

    def _new_version(self) -> Path | None:
        """The folder of the new version the logger picks (and makes: :class:`RunLogger`),
        now; None when the command names the version (a resume, an option) or has no
        logger."""
        folder = None if self._version_given else _logger_folder(self.trainer.logger)
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)  # another logger makes it on first write
            self._made_folder = folder
        return folder

    def _named_version(self) -> Path | None:
        """The folder of a version the command named (``--trainer.logger.init_args.version``),
        made now, so that a fit holds it as it holds any run (two fits naming one version
        would write into one folder); None without such a logger."""
        folder = _logger_folder(self.trainer.logger)
        if not self._version_given or folder is None:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _default_run_name(self) -> str:
        return Path(self._first_config).stem if self._first_config else "captioner"

    def _run_folder_name(self, config) -> str:
        """NAME of runs/NAME/version_N, the same for training and for ``--ckpt_path last``:
        ``--run_name``, else the logger's own name when a config sets one (a run's saved
        config.yaml does), else the first config file's stem."""
        name = _logger_args(config).get("name")
        if config.get("run_name") or name in (None, _DEFAULT_LOGGER_NAME):
            return config.get("run_name") or self._default_run_name()
        return name

    @property
    def best_callback(self) -> ModelCheckpoint:
        """The ModelCheckpoint of the best checkpoint (``--checkpoint.*``)."""
        return next(c for c in self.trainer.callbacks if isinstance(c, ModelCheckpoint))

    def run_summary(self) -> str:
        """Where the run went: its folder, best and last checkpoints."""
        trainer = self.trainer
        best = self.best_callback
        last = next((c for c in trainer.callbacks if isinstance(c, LastCheckpoint)), None)
        if trainer.log_dir is None:  # --trainer.fast_dev_run: Lightning saves nothing
            return "a trial run (fast_dev_run): no run folder, no checkpoint"
        lines = [f"run folder: {trainer.log_dir}"]
        if best.best_model_path:
            score = best.best_model_score
            lines.append(f"best checkpoint: {best.best_model_path} "
                         f"({best.monitor} {float(score):.4f})" if score is not None else "")
        if last is not None and last.path is not None:
            lines.append(f"last checkpoint: {last.path} (epochs done: {last.epochs_done}, "
                         f"step {trainer.global_step})")
        return "\n".join(line for line in lines if line)

    def evaluation_summary(self) -> str:
        """Where validate / test logged their scores (``version_N/test_2/``, say), or ''."""
        folder = _logger_folder(self.trainer.logger)
        return f"scores logged in {folder / 'metrics.csv'}" if folder is not None else ""


def _named_logger(defaults: dict, name: str) -> dict:
    """``defaults`` (TRAINER_DEFAULTS) with ``name`` for its logger's name."""
    logger = defaults.get("logger")
    if not isinstance(logger, dict):
        return defaults
    init_args = {**logger.get("init_args", {}), "name": name}
    return {**defaults, "logger": {**logger, "init_args": init_args}}


def _logger_folder(logger) -> Path | None:
    """The run folder of a fit's logger; None without a logger, and for the DummyLogger that
    --trainer.fast_dev_run swaps in, which has none."""
    log_dir = getattr(logger, "log_dir", None)
    return Path(log_dir) if isinstance(log_dir, str | Path) else None


def _refuse_an_earlier_run(folder: Path) -> None:
    """UserError when the version folder that a new fit names holds a checkpoint of an earlier
    run: its last.ckpt, config.yaml and metrics.csv would be replaced, and its best checkpoint
    kept beside the new run's. A run stopped before its first checkpoint has nothing to resume
    or keep: the new fit starts over in its folder."""
    checkpoints = sorted(path.name for path in folder.glob("checkpoints/*.ckpt"))
    if not checkpoints:
        return
    config = folder / "config.yaml"
    remedy = (f"resume it with captioner fit --config {quote(str(config))} --ckpt_path last "
              "(and a larger --trainer.max_epochs if it has finished), or name another version"
              if config.is_file() else "name another version")
    raise UserError(f"{folder}: holds an earlier run (checkpoints/{first_names(checkpoints, 2)}), "
                    f"which a new fit would overwrite; {remedy}")


def _refuse_replacing(config: Path) -> None:
    """UserError when the config.yaml that a fit without a logger is to write exists: the
    user's own file, or another run's, would be replaced."""
    if config.exists():
        raise UserError(f"{config}: exists, and a fit with --trainer.logger false writes its "
                        "config.yaml there, in place of it (the folder it runs in is its run "
                        "folder); move it, or train with a logger (runs/NAME/version_N)")


def _refuse_earlier_checkpoints(folder: Path) -> None:
    """UserError when the checkpoint folder of a fit that starts afresh holds checkpoints of
    an earlier run (a --checkpoint.dirpath or a --trainer.logger false run given twice): the
    new run would replace its last.ckpt and put its best checkpoint beside the earlier one."""
    checkpoints = sorted(path.name for path in folder.glob("*.ckpt"))
    if checkpoints:
        raise UserError(
            f"{folder}: holds checkpoints of an earlier run ({first_names(checkpoints, 2)}), "
            f"which a new fit would overwrite; resume it with --ckpt_path "
            f"{quote(str(folder / LAST_NAME))}, or give the new run another checkpoint folder")


def _logger_args(config) -> dict:
    """The init_args of the logger of ``config`` ({} without a logger)."""
    return getattr(config.trainer.get("logger"), "init_args", None) or {}


def _version_run(root: Path, name: str, version: int | str, which: str) -> tuple[int | str, Path]:
    """``(version, its last.ckpt)`` of the run version ``ROOT/NAME/version_N`` (an int N) or
    ``ROOT/NAME/V`` (a named version V) that ``--ckpt_path last|best`` is to read."""
    folder = root / name / (f"version_{version}" if isinstance(version, int) else version)
    if not folder.is_dir():
        raise UserError(f"--ckpt_path {which}: --trainer.logger.init_args.version {version} "
                        f"names no run: {folder} does not exist")
    return version, _run_last(folder, which)


def _loggerless_last(config, which: str) -> Path:
    """The last.ckpt that ``--ckpt_path last|best`` names without a logger (``--trainer.logger
    false``): that of the checkpoint folder such a fit writes to, ``--checkpoint.dirpath`` or
    DEFAULT_ROOT_DIR/checkpoints, not a run's of runs/NAME."""
    dirpath = config.checkpoint.get("dirpath")
    folder = (Path(dirpath) if dirpath
              else Path(config.trainer.get("default_root_dir") or ".") / "checkpoints")
    last = folder / LAST_NAME
    if not last.is_file():
        raise UserError(f"--ckpt_path {which}: no {last}: with --trainer.logger false, "
                        f"'{which}' is that of the checkpoint folder {folder}")
    return last


def _run_last(folder: Path, which: str) -> Path:
    """The last.ckpt of the run ``folder`` that ``--ckpt_path last|best`` names; refused when
    it has none yet, naming the fit that trains there in its first epoch if one does."""
    last = last_checkpoint(folder)
    if last is None:
        try:
            RunLock(folder).release()
        except RunInUse as exc:
            raise UserError(f"--ckpt_path {which}: {exc}") from None
        raise UserError(f"--ckpt_path {which}: {folder} has no checkpoints/{LAST_NAME} yet")
    return last


def _log_beside_the_run(init_args, checkpoint: Path, subcommand: str) -> Path | None:
    """Log validate / test of a checkpoint of ``ROOT/NAME/V/checkpoints/`` (a run: V is
    version_N, or a named version) into that run's folder instead of a new run version, and
    return the run's folder (else None). The logger's version says ``V/<subcommand>`` until
    the process of global rank 0, the one that logs, claims its folder there
    (:meth:`CaptionerCLI.before_validate`)."""
    folder = checkpoint.resolve().parent
    # A run's folder: version_N, or a version named with --trainer.logger.init_args.version,
    # whose checkpoints folder fit marks with its progress.json.
    if folder.name != "checkpoints" or (version_number(folder.parent) is None
                                        and not (folder / PROGRESS_NAME).is_file()):
        return None
    init_args["save_dir"] = str(folder.parents[2])
    init_args["name"] = folder.parents[1].name
    init_args["version"] = f"{folder.parent.name}/{subcommand}"
    return folder.parent


def _refuse_a_finished_training(checkpoint: dict, trainer, path: Path) -> None:
    """Raise UserError when ``checkpoint`` (read from ``path``) has trained as far as
    ``trainer``'s max_epochs or max_steps already: Lightning would restore it, train nothing
    and end as if it had trained. Epochs count as Lightning counts them to stop (the fit loop's
    ``epoch_progress.current.processed``: a checkpoint saved inside an epoch has not finished
    it)."""
    loop = checkpoint["loops"].get("fit_loop")
    progress = loop.get("epoch_progress") if isinstance(loop, dict) else None
    current = progress.get("current") if isinstance(progress, dict) else None
    epochs = current.get("processed") if isinstance(current, dict) else None
    steps = checkpoint.get("global_step")
    for done, limit, what in ((epochs, trainer.get("max_epochs"), "epoch"),
                              (steps, trainer.get("max_steps"), "step")):
        if (isinstance(done, int) and isinstance(limit, int) and limit >= 0
                and done >= limit):
            raise UserError(f"--ckpt_path {path}: it has trained {counted(done, what)} already, "
                            f"and --trainer.max_{what}s is {limit}; give a larger max_{what}s "
                            "to train on")


def _check_monitor(checkpoint) -> None:
    """UserError, before training, for a ``--checkpoint.monitor`` the model does not log
    (Lightning would find out after the first epoch's validation, losing the epoch), or a
    ``--checkpoint.mode`` that would keep its worst epoch (a loss at its highest, a score at
    its lowest)."""
    monitor, mode = checkpoint.monitor, checkpoint.get("mode")
    if monitor not in LOGGED_METRICS:
        raise UserError(f"--checkpoint.monitor {monitor!r} is not a metric the model logs "
                        f"({', '.join(LOGGED_METRICS)})")
    better = "min" if monitor.endswith("loss") else "max"
    if mode != better:
        raise UserError(f"--checkpoint.monitor {monitor!r} with --checkpoint.mode {mode!r} "
                        f"would keep the worst epoch; give --checkpoint.mode {better}")


def _name_best_after_monitor(checkpoint) -> None:
    """The default best-checkpoint file name shows val/CIDEr; with another
    ``--checkpoint.monitor`` it shows that metric instead (``best-epoch03-bleu_4=0.2512``),
    so the name never reports a score the checkpoint was not chosen on."""
    default = CHECKPOINT_DEFAULTS["checkpoint.filename"]
    monitor = checkpoint.get("monitor")
    if checkpoint.get("filename") == default and monitor not in (
            None, CHECKPOINT_DEFAULTS["checkpoint.monitor"]):
        metric = monitor.rsplit("/", 1)[-1].lower()
        checkpoint.filename = f"best-epoch{{epoch:02d}}-{metric}={{{monitor}:.4f}}"


def _peer_loss(exc: RuntimeError) -> str | None:
    """What ``exc`` says, in a few words, when it is a collective of a distributed run that
    failed because a peer went away (torch's DistError, from NCCL, or gloo's plain
    RuntimeError, which names its transport); None for any other error. gloo's and NCCL's
    messages name a socket or a collective, then their source file and advice."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None
    text = str(exc).strip()
    if not (isinstance(exc, dist.DistError) or "gloo" in text):
        return None
    told = text.splitlines()[0] if text else type(exc).__name__
    told = re.sub(r"^\[[^\]]*\]\s*", "", told)  # the C++ source file and line
    return told.split(". ")[0].rstrip(".")  # not gloo's advice to read the logs


def end_distributed() -> None:
    """Destroy the process group that DDP started, once the run has ended well. Left alive,
    gloo's worker threads meet interpreter shutdown and abort the process ("terminate called
    without an active exception", exit -6) after the work is done. Not after a failure: the
    other ranks may still wait in a collective, and destroying would hang."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def build_cli(args: list[str] | None, *, run: bool = True,
              on_lost_process: Callable[[str], None] | None = None) -> CaptionerCLI:
    """The CLI for ``args`` (sub-command first when ``run``; None: sys.argv); a DDP process
    it starts that is lost is told to ``on_lost_process``, which should end this process."""
    return CaptionerCLI(
        CaptioningModule,
        CaptionDataModule,
        trainer_class=Trainer,
        args=args,
        on_lost_process=on_lost_process,
        run=run,
        trainer_defaults=TRAINER_DEFAULTS,
        seed_everything_default=0,
        save_config_callback=SaveConfigOnceRestored,
        save_config_kwargs={"overwrite": True},
        # Errors in arguments and configs are raised (one line from the command), not printed
        # after the whole usage. No abbreviated options (--conf for --config; the sub-commands
        # inherit it): the scan of the command line that names the run and compares a config's
        # model keys with a checkpoint reads full names.
        parser_kwargs={"prog": "captioner", "exit_on_error": False, "allow_abbrev": False},
    )

