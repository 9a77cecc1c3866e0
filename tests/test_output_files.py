"""data_prep's file utilities (atomic, paths, output_folders, locks): atomic writes with the
user's file mode, output paths checked before work, non-regular input files refused by name; and
the commands that use them."""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
from pathlib import Path

import pytest

from captioner.checkpointing import load_safely, save_atomically
from data_prep.atomic import atomic_write, write_json
from data_prep.output_folders import check_output_folder, foreign_entries
from data_prep.paths import OutputPathError, check_input_file, check_output_dir, check_output_file
from data_prep.wording import first_names


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_atomic_files_and_checkpoints_get_the_umask_mode(tmp_path, umask):
    with atomic_write(tmp_path / "a.json") as handle:
        handle.write("{}")
    save_atomically({"x": 1}, tmp_path / "model.ckpt")
    for path in (tmp_path / "a.json", tmp_path / "model.ckpt"):
        assert _mode(path) == 0o666 & ~umask  # 0644 under the usual umask, not mkstemp's 0600
    assert load_safely(tmp_path / "model.ckpt") == {"x": 1}


def test_json_files_are_strict_with_null_for_undefined_values(tmp_path):
    path = tmp_path / "metrics.json"
    write_json(path, {"CIDEr": math.nan, "per_image": {"1": [1.5, -math.inf]}, "n": 2})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"CIDEr": None, "per_image": {"1": [1.5, None]}, "n": 2}


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(path) as handle:
        handle.write("new, half")
        raise RuntimeError("disk full")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_output_paths_are_checked(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(OutputPathError, match="is a folder"):
        check_output_file(tmp_path / "folder")
    with pytest.raises(OutputPathError, match="file.txt is not a folder"):
        check_output_file(tmp_path / "file.txt" / "out.json")
    with pytest.raises(OutputPathError, match="not a folder"):
        check_output_dir(tmp_path / "file.txt")
    assert check_output_file(tmp_path / "new" / "deeper" / "out.json")
    assert check_output_dir(tmp_path / "folder")
    # os.access lets root write anywhere, but no file can be made in /proc or /sys.
    for path in ("/proc/metrics.json", "/sys/new/metrics.json"):
        with pytest.raises(OutputPathError, match="kernel's pseudo-filesystems"):
            check_output_file(path)


def test_a_long_list_in_a_message_names_its_first_items_and_counts_the_rest():
    assert first_names(["a", "b", "c"], 3) == "a, b, c"
    assert first_names(["a", "b", "c", "d", "e"], 3) == "a, b, c and 2 more"
    assert first_names([]) == ""
    assert first_names([f"p{i}" for i in range(12)]) == ", ".join(
        f"p{i}" for i in range(10)) + " and 2 more"
    assert first_names(["x: 1, 2", "y: 3", "z"], 2, separator="; ") == "x: 1, 2; y: 3 and 1 more"
    assert first_names([3, 4, 5, 6, 7, 8, 9], 2) == "3, 4 and 5 more"  # ids as well as names


def test_a_folder_of_other_files_names_three_and_counts_the_rest(tmp_path):
    for name in "abcde":
        (tmp_path / name).write_text("")
    with pytest.raises(OutputPathError) as refused:
        check_output_folder(tmp_path, "heatmaps", "index.json", '"vmax_rule"', False,
                            lambda _: {"index.json"})
    assert str(refused.value) == (f"{tmp_path}: folder is not empty (a, b, c and 2 more) and "
                                  "holds no heatmaps of an earlier run; choose a new or empty "
                                  "folder")


def test_files_inside_an_earlier_result_s_folders_are_named_unless_the_result_lists_them(
    tmp_path,
):
    ours = ["index.json", "tvmax/a/00_a.png", "tvmax/a/strip.png", "attention"]
    for name in ["index.json", "tvmax/a/00_a.png", "tvmax/a/strip.png", "tvmax/a/notes.txt",
                 "tvmax/mine/x.txt", "tvmax/mine/y.txt", "extra.txt"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "attention").mkdir()  # the result's own folder, left empty: its own
    (tmp_path / "tvmax" / "empty").mkdir()  # a folder the result did not make
    (tmp_path / "outside").mkdir()
    (tmp_path / "tvmax" / "a" / "link").symlink_to(tmp_path / "outside")  # never followed
    # A folder that is not the result's is named once, not by its content.
    assert foreign_entries(tmp_path, ours) == [
        "extra.txt", "outside", "tvmax/a/link", "tvmax/a/notes.txt", "tvmax/empty", "tvmax/mine"]
    (tmp_path / "index.json").write_text('{"vmax_rule": "maximum"}')
    with pytest.raises(OutputPathError) as refused:
        check_output_folder(tmp_path, "heatmaps", "index.json", '"vmax_rule"', True,
                            lambda _: ours)
    assert str(refused.value) == (
        f"{tmp_path}: holds the heatmaps of an earlier run and other files too (extra.txt, "
        "outside, tvmax/a/link and 3 more), which --overwrite would delete; move them out or "
        "choose a new or empty folder")
    for name in ["extra.txt", "tvmax/a/notes.txt", "tvmax/a/link"]:
        (tmp_path / name).unlink()
    for name in ["outside", "tvmax/empty", "tvmax/mine"]:
        shutil.rmtree(tmp_path / name)
    assert foreign_entries(tmp_path, ours) == []
    assert check_output_folder(tmp_path, "heatmaps", "index.json", '"vmax_rule"', True,
                               lambda _: ours)


def test_a_symbolic_link_stays_a_link_and_its_file_is_written(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "metrics.json").write_text("old")
    (tmp_path / "latest.json").symlink_to("results/metrics.json")
    (tmp_path / "dangling.json").symlink_to("results/new.json")
    for name in ("latest.json", "dangling.json"):
        assert check_output_file(tmp_path / name)
        write_json(tmp_path / name, {"CIDEr": 1.0})
        assert (tmp_path / name).is_symlink()
    assert json.loads((tmp_path / "results" / "metrics.json").read_text()) == {"CIDEr": 1.0}
    assert json.loads((tmp_path / "results" / "new.json").read_text()) == {"CIDEr": 1.0}


@pytest.mark.parametrize("name", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
def test_a_process_open_file_is_refused_and_left_alone(tmp_path, name):
    """Renaming over /dev/stdout would replace the link itself with a plain file (when standard
    output is a file, the link leads to a regular file)."""
    link_before = os.readlink("/dev/stdout")
    with open(tmp_path / "stdout.txt", "w") as stdout:  # standard output is a regular file
        saved = os.dup(1)
        os.dup2(stdout.fileno(), 1)
        try:
            with pytest.raises(OutputPathError, match="leads to a process's open file"):
                check_output_file(name)
            if name != "/dev/stdout":  # a regression would replace the machine's link
                with pytest.raises(OutputPathError, match="leads to a process's open file"):
                    write_json(name, {"CIDEr": 1.0})
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    assert os.readlink("/dev/stdout") == link_before
    assert (tmp_path / "stdout.txt").read_text() == ""


def test_fifos_are_refused_by_name_without_being_opened(tmp_path):
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="pipe.jpg: is a FIFO"):
        check_input_file(fifo)  # opening it would block: the test would hang
    assert check_input_file(tmp_path / "missing.jpg")  # reported later by the reader


def test_an_output_that_is_one_of_the_inputs_is_refused(tmp_path):
    key = tmp_path / "key.json"
    key.write_text("{}")
    (tmp_path / "link.json").symlink_to(key)
    os.link(key, tmp_path / "hard.json")
    (tmp_path / "other.json").write_text("{}")
    reads = [("ratings file", tmp_path / "missing.json"), ("key file", key)]
    for out in (key, tmp_path / "link.json", tmp_path / "hard.json",
                tmp_path / "." / "key.json"):
        with pytest.raises(OutputPathError, match=f"{out.name}: is the key file this command "
                           "reads; writing the output there would replace it"):
            check_output_file(out, reads)
    assert check_output_file(tmp_path / "other.json", reads)
    assert check_output_file(tmp_path / "new.json", reads)
    assert key.read_text() == "{}"


def _tree(folder) -> dict:
    """Every file under ``folder``: relative path -> bytes."""
    return {str(f.relative_to(folder)): f.read_bytes()
            for f in sorted(folder.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("name", ["heatmaps", "gallery", "rating-kit"])
def test_an_out_among_the_inputs_is_refused_and_the_earlier_result_kept(
        name, tiny_checkpoint, tmp_path, capsys):
    """An --out inside the folder of input images (or holding an input image) would feed the
    command its own figures, and --overwrite would delete them while they are read."""
    from PIL import Image

    from captioner.commands import heatmaps
    from eval.commands import gallery, rating_kit

    main = {"heatmaps": heatmaps.main, "gallery": gallery.main, "rating-kit": rating_kit.main}
    photos = tmp_path / "photos"
    photos.mkdir()
    for k, colour in enumerate([(200, 30, 30), (30, 200, 30)]):
        Image.new("RGB", (24, 20), colour).save(photos / f"img{k}.png")
    options = ["--ckpt", str(tiny_checkpoint), "--beam-size", "1", "--max-length", "4",
               "--no-progress", *(["--n", "2"] if name == "rating-kit" else [])]
    inside = photos / "out"
    assert main[name]([str(photos), "--out", str(inside), *options]) == 2
    assert capsys.readouterr().err == (
        f"captioner {name}: {inside}: the output folder lies inside the input folder {photos}, "
        "so its figures would be read as input images by the next run; choose an --out "
        "outside the inputs\n")
    assert not inside.exists()

    out = tmp_path / "out"
    assert main[name]([str(photos), "--out", str(out), *options]) == 0
    capsys.readouterr()
    earlier = _tree(out)
    assert any(name.endswith((".png", ".jpg")) for name in earlier)
    # The earlier result's images given back as inputs: by folder, and as a file by name.
    images = out / "images" if name == "rating-kit" else out
    figure = next(f for f in sorted(out.rglob("*")) if f.suffix in (".png", ".jpg"))
    for given in ([images], [figure]) if name != "rating-kit" else ([images],):
        code = main[name]([*map(str, given), "--out", str(out), *options, "--overwrite"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert ": an input inside the output folder " in err, err
        assert _tree(out) == earlier


@pytest.mark.parametrize("name", ["heatmaps", "gallery", "rating-kit"])
def test_a_replacement_stopped_half_way_keeps_the_earlier_result(
        name, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """--overwrite emptied the folder first: Ctrl-C while the new result was drawn left an
    empty folder where a finished result had been."""
    from PIL import Image

    from captioner.commands import heatmaps
    from eval.commands import gallery, rating_kit

    main = {"heatmaps": heatmaps.main, "gallery": gallery.main, "rating-kit": rating_kit.main}
    photos = tmp_path / "photos"
    photos.mkdir()
    for k, colour in enumerate([(200, 30, 30), (30, 200, 30)]):
        Image.new("RGB", (24, 20), colour).save(photos / f"img{k}.png")
    out = tmp_path / "out"
    args = [str(photos), "--out", str(out), "--ckpt", str(tiny_checkpoint), "--beam-size", "1",
            "--max-length", "4", "--no-progress", *(["--n", "2"] if name == "rating-kit" else [])]
    assert main[name](args) == 0
    earlier = _tree(out)
    key = tmp_path / "out-key.json"
    earlier_key = key.read_bytes() if name == "rating-kit" else None
    save = Image.Image.save
    saved = []

    def stopped_at_the_second_image(image, *a, **k):
        if saved:
            raise KeyboardInterrupt
        saved.append(save(image, *a, **k))

    monkeypatch.setattr(Image.Image, "save", stopped_at_the_second_image)
    with pytest.raises(KeyboardInterrupt):
        main[name]([*args, "--overwrite"])
    assert len(saved) == 1
    assert _tree(out) == earlier and sorted(os.listdir(out)) == sorted(
        p.name for p in out.iterdir() if not p.name.startswith("."))
    if earlier_key is not None:
        assert key.read_bytes() == earlier_key
    monkeypatch.undo()
    # A whole replacement replaces it: the first result differs in its title only.
    assert main[name]([*args, "--overwrite"] + (["--title", "again"] if name != "heatmaps"
                                               else ["--vmax", "0.5"])) == 0
    assert _tree(out) != earlier and not list(out.glob(".partial-*"))
    if earlier_key is not None:
        assert json.loads(key.read_text())["kit_id"] != json.loads(earlier_key)["kit_id"]


def test_a_killed_replacements_staging_folder_is_removed_by_the_next_one(tmp_path):
    """`kill -9` during a replacement leaves its hidden staging folder beside the earlier
    result: it is no one's file to refuse, and the next replacement removes it."""
    from data_prep.output_folders import STAGING_PREFIX, result_folder

    out = tmp_path / "out"
    out.mkdir()
    (out / "index.json").write_text("earlier marker")
    left = out / f"{STAGING_PREFIX}abc"
    left.mkdir()
    (left / "half.png").write_bytes(b"x")

    def ours(folder):
        return ["index.json"]

    assert check_output_folder(out, "heatmaps", "index.json", "marker", True, ours)
    with result_folder(out, earlier=True) as staging:
        assert staging.parent == out and staging.name.startswith(STAGING_PREFIX)
        (staging / "index.json").write_text("new marker")
    assert sorted(p.name for p in out.iterdir()) == ["index.json"]
    assert (out / "index.json").read_text() == "new marker"


def test_a_stop_while_an_earlier_result_is_replaced_waits_for_the_replacement(tmp_path,
                                                                            monkeypatch):
    """Ctrl-C between the removal of the earlier result and the move of the new one left
    neither whole."""
    import os
    import signal

    import data_prep.output_folders
    from data_prep.output_folders import result_folder

    out = tmp_path / "out"
    out.mkdir()
    (out / "index.json").write_text("earlier marker")
    (out / "a.png").write_bytes(b"earlier")
    clear = data_prep.output_folders.clear_folder

    def stopped_while_clearing(folder, names=None):
        clear(folder, names)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(data_prep.output_folders, "clear_folder", stopped_while_clearing)
    with pytest.raises(KeyboardInterrupt):
        with result_folder(out, earlier=True) as staging:
            (staging / "index.json").write_text("new marker")
            (staging / "b.png").write_bytes(b"new")
    assert sorted(p.name for p in out.iterdir()) == ["b.png", "index.json"]
    assert (out / "index.json").read_text() == "new marker"


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_stops_held_delivers_a_stop_once_its_block_has_ended(stop):
    import os
    import signal

    from data_prep.stop_signals import stops_held

    def stop_command(number, frame):  # as captioner.cli stops a command on SIGTERM, SIGHUP
        raise KeyboardInterrupt

    previous = {number: signal.signal(number, stop_command)
                for number in (signal.SIGTERM, signal.SIGHUP)}
    try:
        done = []
        with pytest.raises(KeyboardInterrupt):
            with stops_held():
                os.kill(os.getpid(), getattr(signal, stop))
                done.append("the rest of the block")
        assert done == ["the rest of the block"]
        assert signal.getsignal(signal.SIGTERM) is stop_command
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGHUP"])
def test_kill_stops_a_command_as_ctrl_c_does(stop, tiny_checkpoint, tmp_path, capsys,
                                             monkeypatch):
    """`kill` (SIGTERM) or a closed terminal (SIGHUP) ended the process at once: a replacement
    half drawn stayed, and the next run refused the folder as holding no earlier result."""
    import signal

    from PIL import Image

    from captioner.cli import SIGINT_STATUS, main

    photos = tmp_path / "photos"
    photos.mkdir()
    for k, colour in enumerate([(200, 30, 30), (30, 200, 30)]):
        Image.new("RGB", (24, 20), colour).save(photos / f"img{k}.png")
    out = tmp_path / "out"
    args = ["heatmaps", str(photos), "--out", str(out), "--ckpt", str(tiny_checkpoint),
            "--beam-size", "1", "--max-length", "4", "--no-progress"]
    assert main(args) == 0
    earlier = _tree(out)
    handler = signal.getsignal(getattr(signal, stop))
    save = Image.Image.save

    def killed_while_saving(image, *a, **k):
        save(image, *a, **k)
        os.kill(os.getpid(), getattr(signal, stop))

    monkeypatch.setattr(Image.Image, "save", killed_while_saving)
    capsys.readouterr()
    assert main([*args, "--overwrite"]) == SIGINT_STATUS
    assert capsys.readouterr().err == "captioner heatmaps: interrupted\n"
    assert _tree(out) == earlier and not list(out.glob(".partial-*"))
    assert signal.getsignal(getattr(signal, stop)) == handler  # the caller's, back


@pytest.fixture
def test_split_results(synthetic_data, tmp_path):
    """A test image, a results file captioning every test image, and the references."""
    image = next((synthetic_data.image_root / "test").glob("*.png"))
    references = synthetic_data.karpathy_json
    test_ids = [entry["cocoid"] for entry in json.loads(references.read_text())["images"]
                if entry["split"] == "test"]
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": i, "caption": "a red circle"}
                                   for i in test_ids]))
    return image, results, references


def test_score_summary_and_caption_never_write_over_what_they_read(
        tiny_checkpoint, test_split_results, kit_key_and_ratings, capsys):
    from captioner.commands import caption
    from eval.commands import rating_summary, score

    key, ratings = kit_key_and_ratings
    image, results, references = test_split_results
    cases = [
        (score.main, ["--results", str(results), "--references", str(references), "--split",
                      "test", "--out", str(references)], references, "references file"),
        (score.main, ["--results", str(results), "--references", str(references), "--split",
                      "test", "--out", str(results)], results, "results file"),
        (rating_summary.main, [str(ratings), "--key", str(key), "--out", str(key)], key,
         "key file"),
        (rating_summary.main, [str(ratings), "--key", str(key), "--out", str(ratings)], ratings,
         "ratings file"),
        (caption.main, [str(image), "--ckpt", str(tiny_checkpoint), "--out", str(image)], image,
         "image"),
        (caption.main, [str(image), "--ckpt", str(tiny_checkpoint), "--format", "jsonl",
                        "--out", str(tiny_checkpoint)], tiny_checkpoint, "checkpoint"),
    ]
    for main, argv, read, what in cases:
        before = read.read_bytes()
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and f"{read.name}: is the {what} this command reads" in err, err
        assert read.read_bytes() == before


def test_an_existing_out_file_is_replaced_only_with_overwrite(
        tiny_checkpoint, synthetic_data, test_split_results, kit_key_and_ratings, tmp_path,
        capsys):
    # score's metrics over evaluate's, a summary over another kit's key or a rater's file,
    # captions over a dataset: each replaced a finished file without a word.
    from captioner.commands import caption, prepare_dataset, pretrain_encoder
    from eval.commands import rating_summary, score

    key, ratings = kit_key_and_ratings
    image, results, references = test_split_results
    out = tmp_path / "finished.json"
    missing = str(tmp_path / "missing")
    captions = tmp_path / "captions.jsonl"
    captions.write_text(json.dumps({"image": f"test/{image.name}", "captions": ["a circle"]}))
    cases = [
        (score.main, ["--results", str(results), "--references", str(references), "--split",
                      "test", "--metrics", "Bleu", "--out", str(out)], True),
        (rating_summary.main, [str(ratings), "--key", str(key), "--out", str(out)], True),
        (caption.main, [str(image), "--ckpt", str(tiny_checkpoint), "--format", "coco",
                        "--out", str(out)], True),
        (prepare_dataset.main, ["--captions", str(captions), "--images",
                                str(synthetic_data.image_root), "--out", str(out),
                                "--no-progress"], False),
        # Its report goes beside the weights as NAME.json: weights of another name.
        (pretrain_encoder.main, ["--data", missing, "--images", missing, "--train-instances",
                                 missing, "--val-instances", missing, "--out",
                                 str(out.with_suffix(".pt"))], False),
    ]
    for main, argv, writes in cases:
        target = Path(argv[argv.index("--out") + 1])
        target.write_text("finished work")
        code, err = main(argv), capsys.readouterr().err
        assert code == 2, err
        assert err.endswith(
            f": {target}: exists; choose another --out, or pass --overwrite to replace it\n"), err
        assert target.read_text() == "finished work"
        if writes:
            assert main([*argv, "--overwrite"]) == 0, capsys.readouterr().err
            assert json.loads(target.read_text())


@pytest.fixture
def kit_key_and_ratings(tmp_path):
    from eval.rating.kit import KEY_FORMAT, RATINGS_FORMAT, write_key

    key = {"format": KEY_FORMAT, "kit_id": "kit1", "seed": 0, "vmax": 1.0,
           "models": [{"name": "softmax", "checkpoint": "s.ckpt", "mapping": "softmax"}],
           "images": [{"key": "1", "name": "1.jpg", "labels": {"A": "softmax"}}]}
    write_key(key, tmp_path / "kit-key.json")
    ratings = tmp_path / "r1.json"
    ratings.write_text(json.dumps({
        "format": RATINGS_FORMAT, "kit_id": "kit1", "rater_id": "r1",
        "exported_at": "2026-02-01",
        "ratings": [{"image": "1", "label": "A", "caption_score": 3, "attention_score": 4,
                     "caption_time": "2026-01-01", "attention_time": "2026-01-01"}]}))
    return tmp_path / "kit-key.json", ratings


def test_caption_refuses_an_unwritable_out_before_captioning(tiny_checkpoint, synthetic_data,
                                                             tmp_path, capsys, monkeypatch):
    from captioner.commands import caption
    from captioner.inference.pipeline import Captioner

    monkeypatch.setattr(Captioner, "caption_files", lambda *a, **k: pytest.fail("captioned"))
    image = next((synthetic_data.image_root / "test").glob("*.png"))
    (tmp_path / "results").mkdir()
    code = caption.main([str(image), "--ckpt", str(tiny_checkpoint), "--format", "coco",
                         "--out", str(tmp_path / "results")])
    assert code == 2 and "results: is a folder" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "results").iterdir()] == []


def test_caption_keeps_going_past_a_fifo_and_escapes_odd_names(tiny_checkpoint, synthetic_data,
                                                               tmp_path, capsys):
    from captioner.commands import caption

    image = next((synthetic_data.image_root / "test").glob("*.png"))
    odd = tmp_path / "a\ttab\nnewline.png"
    odd.write_bytes(image.read_bytes())
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    code = caption.main([str(fifo), str(odd), "--ckpt", str(tiny_checkpoint),
                         "--beam-size", "1", "--max-length", "3", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 1 and "pipe.png: is a FIFO" in err
    [line] = out.splitlines()  # one record on one line
    assert line.split("\t")[0] == str(tmp_path) + "/a\\ttab\\nnewline.png"


def test_a_failed_block_removes_the_empty_folders_it_made(tmp_path):
    from data_prep.output_folders import made_folder

    (tmp_path / "a").mkdir()
    with pytest.raises(RuntimeError), made_folder(tmp_path / "a" / "b" / "c"):
        raise RuntimeError("failed")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a"]  # a was there before
    with pytest.raises(KeyboardInterrupt), made_folder(tmp_path / "a" / "b" / "c") as folder:
        (folder.parent / "kept.txt").write_text("work")
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "kept.txt"]
    with made_folder(tmp_path / "d") as folder:
        pass
    assert folder.is_dir()
