"""Every heatmap figure names its word, its caption, its image and its model, and shows the
colour scale: a word's figure in its PNG text chunks (its pixels stay the image and the
word's attention alone, to compose figures from), the caption strip in its drawing (title,
words, colour bar) and in its text chunks too."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from captioner.commands import heatmaps as command
from captioner.inference.heatmaps import (
    STRIP_COLUMNS,
    AttentionRecord,
    image_array,
    render_words,
    strip_figure,
    write_heatmaps,
)

FAST = ["--beam-size", "1", "--max-length", "4", "--no-progress"]


def _record(tokens, source="/photos/park/dog\npark.jpg", caption=None):
    maps = np.zeros((len(tokens), 2, 2), np.float32)
    maps[:, 0, 1] = 0.5
    maps[:, 1, 0] = 0.25
    return AttentionRecord(source, caption or " ".join(tokens), tokens, maps, "tvmax", 0.5)


def test_a_word_figure_carries_its_word_caption_image_model_and_scale(tmp_path):
    record = _record(["ein", "großer", "hund"])
    photo = Image.fromarray(np.full((20, 30, 3), 90, np.uint8))
    write_heatmaps(tmp_path, photo, record, model="coco_tvmax_v0", zero_style="white",
                   max_side=30)
    figure = Image.open(tmp_path / "01_gro_er.png")
    # A newline of the file name is escaped: a viewer shows one line.
    assert figure.text == {
        "Title": "großer · word 2 of 3 · dog\\npark.jpg · coco_tvmax_v0 (tvmax attention)",
        "Word": "großer",
        "Position": "word 2 of 3",
        "Description": "ein großer hund",
        "Caption": "ein großer hund",
        "Image": "/photos/park/dog\\npark.jpg",
        "Model": "coco_tvmax_v0",
        "Attention": "tvmax output attention",
        "Colour scale": "attention weight 0..0.5, the darker the green the higher (opacity "
                        "0.6); zero weight white",
        "Software": "captioner heatmaps",
    }
    # The labels live beside the pixels, which are the word's panel unchanged.
    panels = render_words(image_array(photo, 30), record.attention, vmax=0.5,
                          zero_style="white")
    np.testing.assert_array_equal(np.asarray(figure.convert("RGB")), panels[1])
    strip = Image.open(tmp_path / "strip.png").text
    assert strip["Title"] == "dog\\npark.jpg · coco_tvmax_v0 (tvmax attention)"
    assert strip["Caption"] == "ein großer hund" and strip["Model"] == "coco_tvmax_v0"
    assert "Word" not in strip


def test_the_strip_draws_its_title_words_and_colour_bar_and_wraps_long_captions():
    tokens = [f"w{i}" for i in range(STRIP_COLUMNS + 2)]
    panels = np.full((len(tokens), 12, 16, 3), 200, np.uint8)
    figure = strip_figure(panels, tokens, 0.5, title="a caption\nphoto.jpg · run (tvmax)")
    assert figure.get_suptitle() == "a caption\nphoto.jpg · run (tvmax)"
    *panel_axes, bar = figure.axes
    assert [text.get_text() for ax in panel_axes for text in ax.texts] == tokens
    assert bar.get_ylabel() == "attention weight"
    assert bar.get_ylim() == (0.0, 0.5)
    # Two rows: the first STRIP_COLUMNS panels side by side, the rest below them.
    rows = [round(ax.get_position().y0, 3) for ax in panel_axes]
    assert len(set(rows[:STRIP_COLUMNS])) == 1 and len(set(rows[STRIP_COLUMNS:])) == 1
    assert rows[STRIP_COLUMNS] < rows[0]
    # The colour bar spans both rows.
    assert bar.get_position().y1 >= panel_axes[0].get_position().y1 - 1e-6
    assert bar.get_position().y0 <= panel_axes[-1].get_position().y0 + 1e-6


def test_the_commands_figures_name_word_caption_image_and_checkpoint(tiny_checkpoint,
                                                                      tmp_path, capsys):
    image = tmp_path / "photos" / "dog.png"
    image.parent.mkdir()
    Image.new("RGB", (24, 16), (200, 20, 30)).save(image)
    out = tmp_path / "out"
    assert command.main([str(image), "--ckpt", str(tiny_checkpoint), "--out", str(out),
                         *FAST]) == 0
    [entry] = json.loads((out / "index.json").read_text())["images"]
    record = AttentionRecord.load(out / entry["files"][-1])
    words = [name for name in entry["files"] if name.split("/")[-1][:2].isdigit()]
    assert len(words) == len(record.tokens) > 0
    for index, name in enumerate(words):
        text = Image.open(out / name).text
        assert text["Word"] == record.tokens[index]
        assert text["Position"] == f"word {index + 1} of {len(record.tokens)}"
        assert text["Caption"] == entry["caption"] == record.caption
        assert text["Image"] == str(image)
        assert text["Model"] == tiny_checkpoint.stem == entry["model"]
        assert text["Attention"] == f"{entry['mapping']} output attention"
        assert text["Colour scale"].startswith(f"attention weight 0..{record.vmax:.6g}, ")
    strip = Image.open(out / tiny_checkpoint.stem / "dog" / "strip.png").text
    assert strip["Title"] == f"dog.png · {tiny_checkpoint.stem} ({entry['mapping']} attention)"
