"""``captioner prepare-dataset``: what a captions file's records become, line by line.

An unclosed CSV quote is reported at its line and the lines it swallowed are read again;
duplicate captions of an image are dropped and listed; ``--on-error fail`` names the first
problem in file order; a file that is not UTF-8 is named with the line and byte offset of its
first bad byte.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from captioner.cli import main as cli_main
from data_prep.karpathy import load_karpathy

NAMES = [f"img_{i:03d}.jpg" for i in range(30)]
CAPTION_ROWS = [f"{name},A photo of scene number {i}\n" for i, name in enumerate(NAMES)]


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i, name in enumerate(NAMES):
        Image.fromarray(np.full((24, 32, 3), i * 8, dtype=np.uint8)).save(folder / name)
    return folder


def run(capsys, captions: Path, photos: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    split = [] if "--split" in extra else ["--split", "20,5,5"]  # given once: see options
    code = cli_main(["prepare-dataset", "--captions", str(captions), "--images", str(photos),
                     "--out", str(out), *split, "--no-progress", *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def raws_by_image(out: Path, photos: Path) -> dict[str, tuple[str, ...]]:
    dataset = load_karpathy(out, photos)
    return {e.path.name: e.raws for s in ("train", "val", "test") for e in dataset.split(s)}


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(lines), encoding="utf-8")
    return path


# --- unclosed quotes ---------------------------------------------------------------------------


def test_unclosed_quote_is_reported_and_the_lines_it_swallowed_are_read_again(
        tmp_path, photos, capsys):
    """The user's file: a valid CSV with an unclosed quote at line 21; the csv module reads on
    to the quote of line 25, which closes it, and used to report line 25 alone while the
    captions of lines 22-25 were lost."""
    lines = ["image,caption\n", *CAPTION_ROWS[:19],            # lines 1-20
             'img_003.jpg,"A broken quote caption\n',          # line 21
             *CAPTION_ROWS[19:22],                             # lines 22-24
             'img_022.jpg,"A dog, running"\n',                 # line 25
             *CAPTION_ROWS[23:]]
    captions = write(tmp_path / "quote.csv", lines)
    out = tmp_path / "q.json"
    code, _, err = run(capsys, captions, photos, out)
    assert code == 0, err
    assert "skipped 1 (malformed record): quote.csv line 21\n" in err
    assert (f"{captions} line 21: unclosed quote in 'img_003.jpg,\"A broken quote caption': it "
            "ran on over lines 21-25 (5 lines read as one record); line 21 is skipped and lines "
            "22-25 are read again on their own") in err
    raws = raws_by_image(out, photos)
    assert len(raws) == 30 and sum(map(len, raws.values())) == 30
    for i in (19, 20, 21):                                     # lines 22-24
        assert raws[NAMES[i]] == (f"A photo of scene number {i}",)
    assert raws["img_022.jpg"] == ("A dog, running",)          # line 25
    assert raws["img_003.jpg"] == ("A photo of scene number 3",)

    code, _, err = run(capsys, captions, photos, tmp_path / "f.json", "--on-error", "fail")
    assert code == 2 and err.count("\n") == 1
    assert "malformed record: " in err and "quote.csv line 21: unclosed quote" in err
    assert not (tmp_path / "f.json").exists()


@pytest.mark.parametrize(
    ("broken", "at", "reported"),
    [
        pytest.param(15, 'img_005.jpg,"open to the end\n', "ran on over lines 15-32 (18 lines "
                     "read as one record); line 15 is skipped and lines 16-32 are read again",
                     id="no later quote"),
        pytest.param(32, 'img_005.jpg,"open on the last line\n', "it is still open at the end "
                     "of the file; the line is skipped", id="last line"),
    ],
)
def test_quote_open_to_the_end_of_the_file_loses_no_caption(
        tmp_path, photos, capsys, broken, at, reported):
    """Without a later quote, the csv module silently read every line to the end of the file
    into the caption of the broken line."""
    lines = ["image,caption\n", *CAPTION_ROWS]
    lines.insert(broken - 1, at)
    captions = write(tmp_path / "eof.csv", lines)
    out = tmp_path / "e.json"
    code, _, err = run(capsys, captions, photos, out)
    assert code == 0, err
    assert f"skipped 1 (malformed record): eof.csv line {broken}\n" in err and reported in err
    raws = raws_by_image(out, photos)
    assert {raw for image in raws.values() for raw in image} == {
        f"A photo of scene number {i}" for i in range(30)}


def test_quote_running_past_the_csv_field_limit_is_an_unclosed_quote(tmp_path, photos, capsys):
    """A runaway quote in a long file ends in the csv module's field size limit, which used to
    stop the whole import."""
    long = [f"{NAMES[i % 30]},caption {i} of a long file about a photo of many things\n"
            for i in range(3000)]
    captions = write(tmp_path / "long.csv", ["image,caption\n", *long[:5],
                                              'img_005.jpg,"open quote\n', *long[5:]])
    out = tmp_path / "l.json"
    code, _, err = run(capsys, captions, photos, out)
    assert code == 0, err
    assert "skipped 1 (malformed record): long.csv line 7\n" in err
    assert "long.csv line 7: unclosed quote in 'img_005.jpg,\"open quote': it ran on" in err
    assert sum(map(len, raws_by_image(out, photos).values())) == 3000


def test_quoted_captions_over_several_lines_are_kept(tmp_path, photos, capsys):
    lines = ["image,caption\n", 'img_000.jpg,"A dog\nrunning, fast"\n',
             'img_001.jpg,"Said ""hi""\r\nand left"\n', *CAPTION_ROWS[2:]]
    captions = write(tmp_path / "multi.csv", lines)
    out = tmp_path / "m.json"
    code, _, err = run(capsys, captions, photos, out, "--on-error", "fail")
    assert code == 0, err
    raws = raws_by_image(out, photos)
    assert raws["img_000.jpg"] == ("A dog\nrunning, fast",)
    assert raws["img_001.jpg"] == ('Said "hi"\r\nand left',)
    assert raws["img_002.jpg"] == ("A photo of scene number 2",)


@pytest.mark.parametrize(("row", "kept"), [
    ('img_000.jpg,"A dog" on grass\n', None),
    ('"img_000.jpg"x,A dog on grass\n', None),
    ('img_000.jpg,"A ""dog"" on grass"\n', 'A "dog" on grass'),
    ('img_000.jpg,A "dog" on grass\n', 'A "dog" on grass'),
    ('img_000.jpg,"A dog on grass"  \r\n', "A dog on grass"),
])
def test_a_quote_closed_inside_a_csv_field_is_a_malformed_record(row, kept, tmp_path, photos,
                                                                 capsys):
    """The csv module read '"A dog" on grass' as 'A dog on grass', the quotes lost."""
    captions = write(tmp_path / "mid.csv", ["image,caption\n", row, *CAPTION_ROWS])
    out = tmp_path / "q.json"
    code, _, err = run(capsys, captions, photos, out)
    assert code == 0, err
    caption = raws_by_image(out, photos)["img_000.jpg"]
    if kept is None:
        assert "skipped 1 (malformed record): mid.csv line 2\n" in err
        assert f"mid.csv line 2: a quote closes before the end of its field in {row.strip()!r}" \
            in err
        assert caption == ("A photo of scene number 0",)
    else:
        assert "malformed" not in err
        assert caption == (kept, "A photo of scene number 0")


# --- duplicate captions ------------------------------------------------------------------------


def _duplicate_csv(tmp_path: Path) -> Path:
    return write(tmp_path / "dup.csv", ["image,caption\n", *CAPTION_ROWS,
                                        "img_002.jpg,a PHOTO of scene number 2!\n",   # line 32
                                        "img_004.jpg,Another caption\n",
                                        "img_004.jpg,another caption\n"])             # line 34


def _duplicate_jsonl(tmp_path: Path) -> Path:
    records = [{"image": name, "captions": [f"A photo of scene number {i}", "Two dogs."]
                + (["two dogs", "TWO DOGS!"] if i == 3 else [])}
               for i, name in enumerate(NAMES)]
    path = tmp_path / "dup.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _duplicate_coco(tmp_path: Path) -> Path:
    coco = {"images": [{"id": i, "file_name": name} for i, name in enumerate(NAMES)],
            "annotations": [{"id": i, "image_id": i, "caption": f"A photo of scene number {i}"}
                            for i in range(30)]
            + [{"id": 30, "image_id": 7, "caption": "a photo of scene number 7."}]}
    path = tmp_path / "captions_dup.json"
    path.write_text(json.dumps(coco), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("make", "listed", "example", "image", "kept"),
    [
        pytest.param(_duplicate_csv, "skipped 2 (duplicate caption): dup.csv line 32, dup.csv "
                     "line 34\n", "img_002.jpg: dup.csv line 32 'a PHOTO of scene number 2!' "
                     "repeats dup.csv line 4 'A photo of scene number 2' (tokens: a photo of "
                     "scene number 2); the later one is skipped", "img_004.jpg",
                     ("A photo of scene number 4", "Another caption"), id="csv"),
        pytest.param(_duplicate_jsonl, "skipped 2 (duplicate caption): dup.jsonl line 4 "
                     "caption 3, dup.jsonl line 4 caption 4\n", "img_003.jpg: dup.jsonl line 4 "
                     "caption 3 'two dogs' repeats dup.jsonl line 4 caption 2 'Two dogs.'",
                     "img_003.jpg", ("A photo of scene number 3", "Two dogs."), id="jsonl"),
        pytest.param(_duplicate_coco, "skipped 1 (duplicate caption): captions_dup.json "
                     "annotations[30]\n", "img_007.jpg: captions_dup.json annotations[30] 'a "
                     "photo of scene number 7.' repeats captions_dup.json annotations[7]",
                     "img_007.jpg", ("A photo of scene number 7",), id="coco"),
    ],
)
def test_duplicate_captions_of_an_image_are_dropped_and_listed(
        tmp_path, photos, capsys, make, listed, example, image, kept):
    captions = make(tmp_path)
    out = tmp_path / "d.json"
    code, _, err = run(capsys, captions, photos, out)
    assert code == 0, err
    assert listed in err and f"  e.g. {example}" in err
    assert raws_by_image(out, photos)[image] == kept

    code, _, err = run(capsys, captions, photos, tmp_path / "f.json", "--on-error", "fail")
    # Nothing is skipped when the command stops: the error names the problem alone.
    assert code == 2 and "duplicate caption: " in err
    assert example.removesuffix("; the later one is skipped") in err and "skipped" not in err
    assert not (tmp_path / "f.json").exists()


@pytest.mark.parametrize("image_id", [True, 1.0, "1"])
def test_a_coco_caption_whose_image_id_is_not_an_integer_is_a_malformed_record(
        image_id, tmp_path, photos, capsys):
    # True and 1.0 are equal to the id 1 as dict keys: they were added to image 1 silently.
    coco = json.loads(_duplicate_coco(tmp_path).read_text())
    coco["annotations"][-1] = {"id": 30, "image_id": image_id, "caption": "a stray caption"}
    captions = tmp_path / "captions_ids.json"
    captions.write_text(json.dumps(coco), encoding="utf-8")
    code, _, err = run(capsys, captions, photos, tmp_path / "d.json")
    assert code == 0, err
    assert "skipped 1 (malformed record): captions_ids.json annotations[30]" in err
    assert raws_by_image(tmp_path / "d.json", photos)["img_001.jpg"] == (
        "A photo of scene number 1",)
    code, _, err = run(capsys, captions, photos, tmp_path / "f.json", "--on-error", "fail")
    assert code == 2 and "annotations[30] needs an integer 'image_id'" in err


# --- --on-error fail ---------------------------------------------------------------------------


def test_on_error_fail_names_the_first_problem_in_file_order_then_the_others(
        tmp_path, photos, capsys):
    """Records are checked in stages (fields, then paths, then captions); the error used to
    name the first problem of the first stage that found one: line 55, not line 8."""
    lines = ["image,caption\n"] + [f"{NAMES[i % 30]},caption {i} words\n" for i in range(2, 61)]
    lines[7] = "img_006.jpg,!!!\n"                      # line 8: empty caption
    lines[50] = "img_012.jpg,Caption 12 words.\n"       # line 51: repeats line 12
    lines[54] = "img_011.jpg,a dog, running\n"          # line 55: malformed
    captions = write(tmp_path / "order.csv", lines)
    out = tmp_path / "o.json"
    code, _, err = run(capsys, captions, photos, out, "--on-error", "fail")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("captioner prepare-dataset: empty caption: img_006.jpg: order.csv "
                          "line 8 has no words: '!!!' (and 2 more: duplicate caption at "
                          "order.csv line 51, malformed record at order.csv line 55)")
    assert not out.exists()


def test_skipped_items_are_listed_in_file_order(tmp_path, photos, capsys):
    """CSV captions are gathered by image, so an image's later empty caption used to be listed
    before an earlier line of another image."""
    lines = ["image,caption\n", *CAPTION_ROWS, "img_000.jpg,...\n", "img_001.jpg,a cat\n"]
    lines[3] = "img_002.jpg,?\n"                       # line 4, a later image than line 32's
    captions = write(tmp_path / "empty.csv", lines)
    code, _, err = run(capsys, captions, photos, tmp_path / "e.json", "--split", "20,5,4")
    assert code == 0, err
    assert "skipped 2 (empty caption): img_002.jpg caption 1, img_000.jpg caption 2\n" in err
    assert "e.g. img_002.jpg: empty.csv line 4 has no words: '?'" in err


# --- not UTF-8 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("encoding", "offset"), [("utf-16le", 1), ("utf-16be", 0)])
def test_utf16_without_its_byte_order_mark_is_named_with_how_to_convert(encoding, offset,
                                                                       tmp_path, photos, capsys):
    # Valid UTF-8 to the letter, so it was read, and the header check quoted 'i\x00m\x00...'.
    captions = tmp_path / "windows.csv"
    text = "image,caption\nimg_000.jpg,a dog\n"
    captions.write_bytes(text.encode(encoding))
    code, _, err = run(capsys, captions, photos, tmp_path / "o.json")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    converted = tmp_path / "windows.utf8.csv"
    assert err == (f"captioner prepare-dataset: {captions}: holds a NUL byte (byte offset "
                   f"{offset}), so it is not UTF-8 text; if it is UTF-16 without a byte-order "
                   f"mark, convert it: iconv -f {encoding} -t utf-8 {captions} > {converted}\n")
    # The command it gives converts the file.
    assert subprocess.run(["iconv", "-f", encoding, "-t", "utf-8", str(captions)],
                          capture_output=True, check=True).stdout.decode() == text


@pytest.mark.parametrize(
    ("name", "data", "line", "offset", "before"),
    [
        pytest.param("latin1.csv", "image,caption\nimg_000.jpg,a dog\nimg_001.jpg,un café noir\n"
                     .encode("latin-1"), 3, 50, "img_001.jpg,un caf", id="csv"),
        # Lines ended by a lone CR (old Mac, Excel for Mac), as the readers split them.
        pytest.param("mac.csv", "image,caption\rimg_000.jpg,a dog\rimg_001.jpg,un café noir\r"
                     .encode("latin-1"), 3, 50, "img_001.jpg,un caf", id="csv with CR"),
        pytest.param("bom.csv", b"\xef\xbb\xbf" + "image,caption\nimg_000.jpg,café\n"
                     .encode("latin-1"), 2, 32, "img_000.jpg,caf", id="csv with BOM"),
        pytest.param("latin1.jsonl", '{"image": "img_000.jpg", "captions": ["crème"]}\n'
                     .encode("latin-1"), 1, 41, '{"image": "img_000.jpg", "captions": ["cr',
                     id="jsonl"),
        pytest.param("captions_latin1.json", '{"images": [],\n "annotations": ["é"]}'
                     .encode("latin-1"), 2, 33, ' "annotations": ["', id="coco"),
    ],
)
def test_not_utf8_names_the_line_and_byte_offset_and_how_to_convert(
        tmp_path, photos, capsys, name, data, line, offset, before):
    captions = tmp_path / name
    captions.write_bytes(data)
    assert data[offset] >= 0x80 and data[offset - 1] < 0x80
    code, _, err = run(capsys, captions, photos, tmp_path / "o.json")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    converted = captions.with_name(f"{captions.stem}.utf8{captions.suffix}")
    assert (f"{captions} line {line} (byte offset {offset}): not UTF-8 text: byte "
            f"0x{data[offset]:02x} after {before!r} (invalid continuation byte); if the file is "
            f"Windows-1252 or Latin-1 text, convert it: iconv -f cp1252 -t utf-8 {captions} > "
            f"{converted}") in err
