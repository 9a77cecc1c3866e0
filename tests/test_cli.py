"""The ``captioner`` console script: its command list, unknown commands, a closed pipe, and
how every command reports a user error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from captioner import CONFIGS
from captioner.cli import SIGPIPE_STATUS, main
from captioner.reporting import report_error


def _captioner(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "captioner.cli", *argv], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})


@pytest.mark.subprocess
def test_python_dash_m_captioner_runs_the_console_script():
    run = subprocess.run([sys.executable, "-m", "captioner", "no-such-command"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "unknown command 'no-such-command'" in run.stderr


def test_help_lists_the_commands_and_unknown_ones_are_refused(capsys):
    assert main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert "caption " in listed and "fit " in listed and "demo " in listed
    assert main(["nosuch"]) == 2
    assert capsys.readouterr().err == (
        "captioner: unknown command 'nosuch'; 'captioner --help' lists them\n")
    assert main(["captoin", "photo.jpg"]) == 2  # a typo: the command meant, on one line
    assert capsys.readouterr().err == (
        "captioner: unknown command 'captoin'; did you mean 'caption'? 'captioner --help' "
        "lists them\n")


@pytest.mark.subprocess
def test_a_reader_that_has_gone_ends_the_command_quietly(tmp_path):
    # `captioner runs | head -1`: the reading end is closed before the command writes.
    (tmp_path / "runs" / "a" / "version_0").mkdir(parents=True)
    read, write = os.pipe()
    os.close(read)
    try:
        run = subprocess.run([sys.executable, "-m", "captioner.cli", "runs", "--root",
                              str(tmp_path / "runs")], stdout=write, stderr=subprocess.PIPE,
                             text=True, timeout=120)
    finally:
        os.close(write)
    assert run.returncode == SIGPIPE_STATUS, run.stderr
    assert run.stderr == ""


def test_a_user_error_is_one_line_and_captioner_debug_shows_its_traceback(monkeypatch, capsys):
    split = KeyError("unknown split 'testing'; expected one of train, val, test")
    assert report_error("captioner evaluate", split) == 2
    assert capsys.readouterr().err == (
        "captioner evaluate: unknown split 'testing'; expected one of train, val, test\n")
    yaml = ValueError("Problems parsing config: while parsing\n  in line 2\ndid not find ']'")
    assert report_error("captioner fit", yaml, "--config a.yaml", status=1) == 1
    assert capsys.readouterr().err == (
        "captioner fit: --config a.yaml: Problems parsing config: while parsing in line 2 did "
        "not find ']'\n")
    # An error of the operating system names its path first, not as Python's repr.
    for exc, line in (
        (PermissionError(13, "Permission denied", "runs/x"), "runs/x: permission denied"),
        (OSError(30, "Read-only file system", "a/m.csv", None, "a/old.csv"),
         "a/m.csv -> a/old.csv: read-only file system"),
        (OSError(27, "File too large"), "file too large"),
        (OSError("unable to lock file"), "unable to lock file"),  # no errno: as it is
        # torch re-raises a loader worker's error with the worker's traceback in its message.
        (ValueError("Caught ValueError in DataLoader worker process 1.\nOriginal Traceback "
                    "(most recent call last):\n  File \"data.py\", line 1, in fetch\n    x()\n"
                    "ValueError: f.h5: dataset 'features' holds NaN\n"),
         "f.h5: dataset 'features' holds NaN"),
    ):
        assert report_error("captioner fit", exc) == 2
        assert capsys.readouterr().err == f"captioner fit: {line}\n"
    monkeypatch.setenv("CAPTIONER_DEBUG", "1")
    with pytest.raises(KeyError) as raised:
        try:
            raise split
        except KeyError as exc:
            report_error("captioner evaluate", exc)
    assert raised.value is split and capsys.readouterr().err == ""


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_user_error_starts_its_own_line_after_an_open_progress_bar(capsys, stream):
    # Lightning leaves its epoch bar open (its text ends without a newline) when a fit meets a
    # corrupt image mid-epoch: on a terminal the error line would go on the bar's line.
    from tqdm import tqdm

    bar = tqdm(total=38, desc="Epoch 0", file=getattr(sys, stream))
    bar.update(14)
    assert report_error("captioner fit", ValueError("a.png: corrupt or truncated image")) == 2
    captured = capsys.readouterr()
    line = "captioner fit: a.png: corrupt or truncated image"
    if stream == "stdout":
        assert "14/38" in captured.out and captured.out.endswith("\n")
        assert captured.err == line + "\n"
    else:
        assert "14/38" in captured.err and captured.err.split("\n")[-2:] == [line, ""]


@pytest.mark.subprocess
def test_every_command_honours_captioner_debug(tmp_path):
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    image = tmp_path / "a.png"
    image.write_bytes(b"")
    for command in (["caption", str(image)],
                    ["heatmaps", str(image), "--out", str(tmp_path / "out")]):
        quiet = _captioner(*command, "--ckpt", str(garbage))
        assert quiet.returncode == 2 and "Traceback" not in quiet.stderr
        assert quiet.stderr.count("\n") == 1 and str(garbage) in quiet.stderr
        loud = _captioner(*command, "--ckpt", str(garbage), CAPTIONER_DEBUG="1")
        assert loud.returncode != 0 and "Traceback" in loud.stderr


def _argparse_commands() -> list[str]:
    """The commands whose options argparse reads (fit, validate and test: LightningCLI's)."""
    import importlib

    from captioner.cli import _commands

    return sorted(name for name, module in _commands().items()
                  if not getattr(importlib.import_module(module), "NEEDS_COMMAND_NAME", False))


@pytest.mark.parametrize("command", _argparse_commands())
def test_a_bad_option_is_one_line_not_the_whole_usage(command, capsys):
    from captioner.cli import main

    words = [command, "model"] if command == "bench" else [command]  # bench's own: a benchmark
    with pytest.raises(SystemExit) as exit_info:
        main([*words, "--no-such-option"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"captioner {' '.join(words)}: error: ") and err.count("\n") == 1


@pytest.mark.parametrize("command", [["caption", "a.png"],
                                     ["evaluate", "--data", "d.json", "--images", "i"]])
def test_a_checkpoint_given_twice_to_a_one_checkpoint_command_is_refused(command, capsys):
    """argparse keeps the last of two: `caption --ckpt A --ckpt B` captioned with B alone."""
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--ckpt", "runs/a.ckpt", "--ckpt", "runs/b.ckpt"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (f"captioner {command[0]}: error: --ckpt is given twice "
                                       "(runs/a.ckpt and runs/b.ckpt); give it once\n")


@pytest.mark.subprocess
def test_a_config_file_that_is_not_yaml_is_named_on_one_line(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("model:\n  hidden_dim: [1\n")
    good = CONFIGS / "demo_tvmax.yaml"  # the file at fault is named, not every one
    run = _captioner("fit", "--config", str(good), "--config", str(broken))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    [line] = [line for line in run.stderr.splitlines() if line.startswith("captioner fit:")]
    assert line.startswith(f"captioner fit: --config {broken}: Problems parsing config")
    assert run.stderr.strip() == line


@pytest.mark.parametrize("command", ["score", "heatmaps", "gallery", "rating-kit", "evaluate"])
def test_ctrl_c_is_one_line_with_status_130(command, monkeypatch, capsys):
    import importlib

    from captioner.cli import SIGINT_STATUS, _commands

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(_commands()[command]), "main", interrupted)
    assert main([command, "--whatever"]) == SIGINT_STATUS == 130
    assert capsys.readouterr().err == f"captioner {command}: interrupted\n"


@pytest.mark.parametrize("progress", [
    "{not json", "[" * 100_000 + "]" * 100_000,
    '{"epochs_done": 1, "global_step": 4, "monitor": "val/CIDEr", "best_score": "0.44", '
    '"best_checkpoint": null, "last_checkpoint": "last.ckpt"}',
    '{"epochs_done": 1, "global_step": 4}',
], ids=["not JSON", "nested too deep", "a score that is a string", "fields missing"])
def test_runs_says_what_a_run_without_readable_progress_holds(progress, tmp_path, capsys):
    from captioner.commands import runs

    (tmp_path / "runs" / "a" / "version_0").mkdir(parents=True)
    damaged = tmp_path / "runs" / "b" / "version_0" / "checkpoints"
    damaged.mkdir(parents=True)
    (damaged / "last.ckpt").write_bytes(b"")
    (damaged / "progress.json").write_text(progress)
    assert runs.main(["--root", str(tmp_path / "runs")]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert rows[0].startswith("a ") and rows[0].endswith(
        "(stopped before its first checkpoint: nothing to resume)")
    assert rows[1].startswith("b ") and rows[1].endswith(
        "(progress.json missing or unreadable; checkpoints: last.ckpt)")
    # A fit holds it: training in its first epoch.
    from data_prep.locks import hold_exclusively, let_go

    held = hold_exclusively(tmp_path / "runs" / "a" / "version_0")
    try:
        assert runs.main(["--root", str(tmp_path / "runs")]) == 0
    finally:
        let_go(held)
    assert capsys.readouterr().out.splitlines()[1].endswith("(no checkpoint yet)")


def test_runs_given_a_run_folder_names_the_runs_folder_above_it(tmp_path, capsys):
    from captioner.commands import runs

    run = tmp_path / "runs" / "coco_tvmax"
    (run / "version_0" / "checkpoints").mkdir(parents=True)
    for root in (run, run / "version_0"):
        assert runs.main(["--root", str(root)]) == 2
        assert capsys.readouterr().err == (
            f"captioner runs: {root} is a run's folder, not a folder of runs; give the one "
            f"that holds them: --root {tmp_path / 'runs'}\n")
    assert runs.main(["--root", str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("coco_tvmax ")
    # A folder without runs is no error; a file is not a folder.
    assert runs.main(["--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"no runs under {tmp_path}\n"
    (tmp_path / "runs.txt").write_text("")
    assert runs.main(["--root", str(tmp_path / "runs.txt")]) == 2
    assert capsys.readouterr().err == f"captioner runs: not a folder: {tmp_path / 'runs.txt'}\n"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["heatmaps", "gallery", "rating-kit"])
def test_overwrite_never_deletes_files_beside_an_earlier_result(
    command, tiny_checkpoint, synthetic_data, tmp_path, capsys
):
    out = tmp_path / "out"
    args = [command, str(synthetic_data.image_root / "test"), "--ckpt", str(tiny_checkpoint),
            "--out", str(out), "--beam-size", "1", "--max-length", "4", "--no-progress",
            *(["--n", "2"] if command == "rating-kit" else [])]
    assert main(args) == 0
    result = sorted(path.relative_to(out) for path in out.rglob("*"))
    (out / "notes.txt").write_text("which model is which: ask Ana")
    capsys.readouterr()

    assert main([*args, "--overwrite"]) == 2
    assert capsys.readouterr().err == (
        f"captioner {command}: {out}: holds the {command.replace('-', ' ')} of an earlier run "
        "and other files too "
        "(notes.txt), which --overwrite would delete; move them out or choose a new or empty "
        "folder\n")
    assert (out / "notes.txt").read_text() == "which model is which: ask Ana"
    assert sorted(path.relative_to(out) for path in out.rglob("*")) == sorted(
        [*result, (out / "notes.txt").relative_to(out)])

    (out / "notes.txt").unlink()
    # A file left inside one of the result's own folders is no more the result's.
    inner = max((path for path in out.rglob("*") if path.is_dir()), key=lambda p: len(p.parts))
    (inner / "notes.txt").write_text("which model is which: ask Ana")
    assert main([*args, "--overwrite"]) == 2
    assert capsys.readouterr().err == (
        f"captioner {command}: {out}: holds the {command.replace('-', ' ')} of an earlier run "
        f"and other files too ({(inner / 'notes.txt').relative_to(out).as_posix()}), which "
        "--overwrite would delete; move them out or choose a new or empty folder\n")
    assert (inner / "notes.txt").read_text() == "which model is which: ask Ana"

    (inner / "notes.txt").unlink()  # the earlier result alone is replaced
    assert main([*args, "--overwrite"]) == 0


@pytest.mark.subprocess
def test_unknown_tvmax_settings_in_the_environment_are_one_line(tiny_checkpoint, synthetic_data):
    image = next((synthetic_data.image_root / "test").iterdir())
    run = _captioner("caption", str(image), "--ckpt", str(tiny_checkpoint), "--no-progress",
                     CAPTIONER_TVMAX_SOLVER="gpu")
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == ("captioner caption: CAPTIONER_TVMAX_SOLVER must be one of ('host', "
                          "'device'), got 'gpu'\n")
    run = _captioner("caption", str(image), "--ckpt", str(tiny_checkpoint), "--no-progress",
                     CAPTIONER_TVMAX_OVERLAP="yes")
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == "captioner caption: CAPTIONER_TVMAX_OVERLAP must be 0 or 1, got 'yes'\n"
    run = _captioner("caption", str(image), "--ckpt", str(tiny_checkpoint), "--no-progress",
                     CAPTIONER_TVMAX_SOLVER="host", CAPTIONER_TVMAX_OVERLAP="1")
    assert run.returncode == 0 and run.stdout.startswith(f"{image}\t")


def test_under_ddp_only_the_first_process_reports_a_user_error(tmp_path, capsys, monkeypatch):
    """Lightning starts DDP's other ranks as copies of the command: each met the same error,
    and the user read it once per process."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    argv = ["fit", "--config", str(tmp_path / "missing.yaml")]
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    assert main(argv) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("captioner fit: ") and "missing.yaml" in err and err.count("\n") == 1


def test_a_ctrl_c_after_a_command_returned_is_ignored(monkeypatch):
    # The command's work is done and said; a Ctrl-C while Python shuts down (torch's and
    # Lightning's exit handlers) ended it with status 130 and no line, or a traceback.
    import captioner.cli as cli

    monkeypatch.setattr(cli, "main", lambda: 0)
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli.console()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # a KeyboardInterrupt would be raised here
    finally:
        signal.signal(signal.SIGINT, previous)
    assert exit_info.value.code == 0


@pytest.mark.parametrize(("config", "attention"), [
    ("model:\n  input_attention: softmax\n  output_attention: tvmax\n"
     "  output_attention_kwargs:\n    lam: 0.01\n    learn_lam: true\n",
     "softmax/tvmax lam=0.01 learn_lam=True"),
    ("model:\n  input_attention: sparsemax\n  output_attention: fusedmax\n"
     "  output_attention_kwargs: null\n", "sparsemax/fusedmax"),
    ("model: [1, 2]\n", "?"),
    ("{{not yaml", "?"),
    # A class_path is data here: safe_load builds no object.
    ("model: !!python/object/apply:os.system ['echo hi']\n", "?"),
    (None, "?"),
])
def test_runs_tell_the_attention_each_run_trained_with(config, attention, tmp_path, capsys):
    # Runs of one config name may train other mappings (--model.output_attention): the list
    # told them apart by nothing.
    from captioner.commands import runs

    folder = tmp_path / "runs" / "coco_tvmax" / "version_0"
    (folder / "checkpoints").mkdir(parents=True)
    if config is not None:
        (folder / "config.yaml").write_text(config)
    assert runs.main(["--root", str(tmp_path / "runs")]) == 0
    header, row = capsys.readouterr().out.splitlines()
    column = header.index("in/out attention")
    assert header.split()[2] == "in/out" and row[column:].startswith(attention + " ")


def test_runs_lists_named_versions_in_the_order_of_their_numbers(tmp_path, capsys):
    from captioner.commands import runs

    for version in ("V10", "V2", "mine", "V1"):
        (tmp_path / "runs" / "a" / version / "checkpoints").mkdir(parents=True)
    assert runs.main(["--root", str(tmp_path / "runs")]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [row.split()[1] for row in rows] == ["V1", "V2", "V10", "mine"]


def test_a_signal_ignored_when_a_command_starts_stays_ignored(monkeypatch):
    # `nohup captioner fit ...` ignores SIGHUP so that closing the terminal leaves the fit
    # running; the stop handlers took it over and the fit stopped all the same.
    import importlib

    from captioner.cli import _commands

    seen = {}

    def handlers(argv):
        seen.update({number: signal.getsignal(number)
                     for number in (signal.SIGHUP, signal.SIGTERM)})
        return 0

    monkeypatch.setattr(importlib.import_module(_commands()["runs"]), "main", handlers)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert main(["runs"]) == 0
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert seen[signal.SIGHUP] is signal.SIG_IGN and seen[signal.SIGTERM] is not signal.SIG_DFL


def test_a_lightning_run_leaves_sigterm_to_the_command():
    # Lightning's own SIGTERM handler broadcast a tensor from inside the handler: one of eight
    # SIGTERMs to the first process of a two-process DDP fit on CPU hung there, while the other
    # process waited in backward's all-reduce. SIGTERM is the command's Ctrl-C instead, while
    # each stage runs (seen from inside its steps) and after it.
    from lightning.pytorch import Callback
    from lightning.pytorch.demos.boring_classes import BoringModel

    from captioner.training.trainer import Trainer

    def stop(number, frame):
        raise KeyboardInterrupt

    class SeeSigterm(Callback):
        def __init__(self):
            self.seen = []

        def on_train_batch_start(self, *_):
            self.seen.append(signal.getsignal(signal.SIGTERM))

        on_validation_batch_start = on_test_batch_start = on_train_batch_start

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        seeing = SeeSigterm()
        trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                          enable_model_summary=False, enable_checkpointing=False, max_steps=1,
                          limit_val_batches=1, limit_test_batches=1, callbacks=[seeing])
        trainer.fit(BoringModel())
        trainer.test(BoringModel(), verbose=False)
        assert len(seeing.seen) == 3  # sanity check, training, test
        assert all(handler is stop for handler in seeing.seen)
        assert signal.getsignal(signal.SIGTERM) is stop
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Finalized:
    """Stopped in its finalizer, as a loader's iterator ending its workers at an epoch's end."""

    def __del__(self):
        raise KeyboardInterrupt


def test_a_stop_that_lands_in_a_finalizer_stops_the_command_in_one_line(monkeypatch, capsys):
    # Python swallows an exception raised in __del__ ("Exception ignored in ..." and its
    # traceback), and the command went on as if no Ctrl-C had come.
    import importlib

    from captioner.cli import SIGINT_STATUS, _commands

    def finalizes(argv):
        _Finalized()  # dropped at once: __del__ runs here
        time.sleep(5)  # the stop is raised again before this ends
        return 0

    monkeypatch.setattr(importlib.import_module(_commands()["runs"]), "main", finalizes)
    started = time.monotonic()
    assert main(["runs"]) == SIGINT_STATUS
    assert time.monotonic() - started < 4
    assert capsys.readouterr().err == "captioner runs: interrupted\n"


def test_loader_workers_leave_stop_signals_to_the_main_process():
    # `timeout`, Slurm's scancel and a closed terminal signal the whole process group: a worker
    # that SIGTERM ended made torch raise "DataLoader worker (pid N) is killed by signal" in
    # the main process, in the middle of its graceful stop. It ends a moment later, with
    # status 0, which torch does not take for a failure.
    import multiprocessing

    from captioner.training.datamodule import WORKER_GRACE_S

    context = multiprocessing.get_context("fork")
    worker = context.Process(target=_start_a_worker_then_signal_it)
    started = time.monotonic()
    worker.start()
    worker.join(60)
    assert worker.exitcode == 0
    assert WORKER_GRACE_S <= time.monotonic() - started < WORKER_GRACE_S + 20


def _start_a_worker_then_signal_it() -> None:
    from captioner.training.datamodule import start_worker

    start_worker(0, rank=0)
    for number in (signal.SIGTERM, signal.SIGHUP):
        os.kill(os.getpid(), number)
    time.sleep(60)
    sys.exit(7)  # not reached: the worker ended itself


@pytest.mark.subprocess
def test_a_process_that_exits_while_its_loader_workers_live_ends():
    # At exit multiprocessing ends the workers still alive with SIGTERM and waits for them: a
    # worker that ignored SIGTERM for good hung the command after its last line.
    code = (
        "import functools, sys\n"
        "from torch.utils.data import DataLoader\n"
        "from captioner.training.datamodule import start_worker\n"
        "loader = DataLoader(list(range(100)), batch_size=1, num_workers=2,\n"
        "                    worker_init_fn=functools.partial(start_worker, rank=0))\n"
        "iterator = iter(loader)\n"
        "next(iterator)\n"
        "sys.modules['__main__'].alive_at_exit = iterator\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_runs_show_the_scores_of_a_tested_run(tmp_path, capsys):
    import json

    from captioner.commands import runs

    folder = tmp_path / "runs" / "coco_tvmax" / "version_0"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "progress.json").write_text(json.dumps({
        "epochs_done": 3, "global_step": 30, "best_score": 0.5, "monitor": "val/CIDEr",
        "best_checkpoint": None, "last_checkpoint": "last.ckpt"}))
    assert runs.main(["--root", str(tmp_path / "runs")]) == 0
    untested = capsys.readouterr().out.splitlines()[1]
    assert "test:" not in untested
    (folder / "test").mkdir()
    # As Lightning's CSV logger writes a test's scores (an earlier test first, then the last).
    (folder / "test" / "metrics.csv").write_text(
        "epoch,step,test/Bleu_4,test/CIDEr\n0,30,0.1,0.2\n0,30,0.2345,0.81234\n")
    assert runs.main(["--root", str(tmp_path / "runs")]) == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert row == untested + "  test: CIDEr 0.8123 Bleu_4 0.2345"
    # A later test (of another checkpoint) logs into test_2, test_3, ...: its scores show.
    for number, cider in ((2, "0.5"), (10, "0.25"), (3, "0.75")):
        (folder / f"test_{number}").mkdir()
        (folder / f"test_{number}" / "metrics.csv").write_text(
            f"epoch,step,test/CIDEr\n0,30,{cider}\n")
    assert runs.main(["--root", str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out.splitlines()[1] == untested + "  test: CIDEr 0.2500"
    # The checkpoint scored, as the test's config.yaml names it (escaped: untrusted text).
    (folder / "test_10" / "config.yaml").write_text(json.dumps(
        {"ckpt_path": f"{folder}/checkpoints/best-epoch02-cider0.8100\x1b[2J.ckpt"}))
    assert runs.main(["--root", str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        untested + "  test of best-epoch02-cider0.8100\\x1b[2J.ckpt: CIDEr 0.2500")
    for number in (2, 3, 10):
        (folder / f"test_{number}" / "metrics.csv").unlink()
    # A damaged file (the run's files are untrusted) shows what can be read, or nothing.
    (folder / "test" / "metrics.csv").write_text("epoch,test/CIDEr,test/x\n0,nan,\x1b[2J\n")
    assert runs.main(["--root", str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out.splitlines()[1] == untested


def test_runs_show_the_epochs_done_of_those_the_fit_trains_to(tmp_path, capsys):
    import json

    from captioner.commands import runs

    progress = {"epochs_done": 2, "global_step": 20, "best_score": None, "monitor": None,
                "best_checkpoint": None, "last_checkpoint": "last.ckpt"}
    for version, extra in enumerate(({"max_epochs": 6}, {}, {"max_epochs": None},
                                     {"max_epochs": True})):
        folder = tmp_path / "runs" / "coco_tvmax" / f"version_{version}" / "checkpoints"
        folder.mkdir(parents=True)
        (folder / "progress.json").write_text(json.dumps({**progress, **extra}))
    assert runs.main(["--root", str(tmp_path / "runs")]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    # Stopped (or training) at 2 of 6; files without max_epochs show the epochs done; a
    # damaged one (a bool: untrusted) is no run's progress.
    assert [row.split()[3] for row in rows] == ["2/6", "2", "2", "-"]
