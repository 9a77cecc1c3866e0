"""Heatmap rendering: exact upsampling, exact zeros, shared colour scale, raw weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from captioner.inference.heatmaps import (
    OVERLAY_OPACITY,
    AttentionRecord,
    attention_overlay,
    checkpoint_names,
    colormap,
    compose,
    display_size,
    image_array,
    render_strip,
    render_words,
    sanitize,
    shared_vmax,
    unique_stems,
    upsample_attention,
    word_figure_name,
    write_heatmaps,
)


def _sparse_maps() -> np.ndarray:
    """Three 3 x 4 maps summing to 1: two sparse ones and a dense (softmax-like) one."""
    maps = np.zeros((3, 3, 4), np.float32)
    maps[0, 0, 0], maps[0, 1, 2] = 0.25, 0.75
    maps[1, 2, 3] = 1.0
    maps[2] = 1.0 / 12
    return maps


@pytest.mark.parametrize("size", [(7, 11), (12, 16), (9, 5)])
@pytest.mark.parametrize(
    "mode, resample",
    [("nearest", Image.Resampling.NEAREST), ("bilinear", Image.Resampling.BILINEAR)],
)
def test_upsampling_matches_pillow(size, mode, resample):
    grid = np.random.default_rng(1).random((3, 4)).astype(np.float32)
    expected = np.asarray(Image.fromarray(grid, mode="F").resize(size[::-1], resample))
    np.testing.assert_allclose(upsample_attention(grid, size, mode), expected, atol=1e-6)


def test_nearest_fills_whole_cells_and_keeps_exact_zeros():
    up = upsample_attention(_sparse_maps(), (6, 8), "nearest")
    assert up.shape == (3, 6, 8)
    np.testing.assert_array_equal(up[0, 2:4, 4:6], 0.75)
    assert (up[0] == 0).sum() == 6 * 8 - 2 * 4
    assert (up[2] > 0).all()


def test_bilinear_is_zero_only_far_from_attended_cells():
    up = upsample_attention(_sparse_maps()[1], (30, 40), "bilinear")
    assert up[0, 0] == 0.0 and up[12, 15] == 0.0  # the four cells around it are zero
    assert 0 < up[20, 30] < 1  # interpolated towards the attended cell (2, 3)
    assert up[-1, -1] == pytest.approx(1.0) and (up >= 0).all()


def test_upsample_rejects_bad_input():
    with pytest.raises(ValueError, match="upsample mode"):
        upsample_attention(_sparse_maps(), (4, 4), "gaussian")
    with pytest.raises(ValueError, match="non-negative"):
        upsample_attention(-_sparse_maps(), (4, 4))


def test_display_size_keeps_aspect_ratio_up_to_four_to_one():
    assert display_size(640, 480, 384) == (384, 288)
    assert display_size(400, 100, 100) == (100, 25)  # exactly 4:1: kept
    # More elongated: the short side is stretched to a quarter of the long one, not 1 px.
    assert display_size(10, 1000, 100) == (25, 100)
    assert display_size(10000, 20) == (384, 96)
    assert display_size(1000, 1, 1) == (1, 1)


@pytest.mark.parametrize("wide", [True, False], ids=["10000x20", "20x10000"])
def test_panorama_figures_show_the_whole_image_with_the_grid_aligned(tmp_path, wide):
    # The last quarter of the long side is red, the rest grey; the grid has 4 cells along the
    # long side and 2 across, and one word attends only to the cell over the red quarter's
    # second half across the short side.
    red, grey = np.array([200, 0, 0], np.uint8), np.array([100, 100, 100], np.uint8)
    photo = np.tile(grey, (20, 10000, 1))
    photo[:, 7500:] = red
    maps = np.zeros((2, 2, 4), np.float32)
    maps[0, 1, 3] = 1.0
    maps[1] = 1.0 / 8
    if not wide:
        photo, maps = photo.transpose(1, 0, 2), maps.transpose(0, 2, 1)
    record = AttentionRecord("pano.png", "red end", ["red", "end"], maps, "tvmax", vmax=1.0)
    for style in ("white", "transparent"):
        write_heatmaps(tmp_path / style, Image.fromarray(photo), record, zero_style=style)
    size = (384, 96) if wide else (96, 384)
    for style in ("white", "transparent"):
        for name in ("00_red.png", "01_end.png"):
            assert Image.open(tmp_path / style / name).size == size
        strip = Image.open(tmp_path / style / "strip.png").size
        assert min(strip) > 60  # panels of 2 x 0.5 inches at 100 dpi, not 2 x 0.005

    def along(figure):  # figure as (short side, long side, 3)
        return figure if wide else figure.transpose(1, 0, 2)

    white = along(np.asarray(Image.open(tmp_path / "white" / "00_red.png").convert("RGB")))
    coloured = (white != 255).any(axis=-1)
    expected = np.zeros((96, 384), bool)
    expected[48:, 288:] = True  # cell (1, 3) of the 2 x 4 grid over 96 x 384 pixels
    np.testing.assert_array_equal(coloured, expected)
    green = compose(red[None, None], attention_overlay(np.ones((1, 1), np.float32), 1.0))[0, 0]
    np.testing.assert_array_equal(white[60:, 300:], np.broadcast_to(green, (36, 84, 3)))
    # Where attention is zero the image shows through: grey before the red quarter, red in it.
    plain = along(np.asarray(Image.open(tmp_path / "transparent" / "00_red.png").convert("RGB")))
    np.testing.assert_array_equal(plain[:, :280], np.broadcast_to(grey, (96, 280, 3)))
    np.testing.assert_array_equal(plain[:40, 296:], np.broadcast_to(red, (40, 88, 3)))


def test_overlay_is_transparent_exactly_where_attention_is_zero():
    weights = upsample_attention(_sparse_maps()[0], (6, 8))
    overlay = attention_overlay(weights, vmax=0.75)
    np.testing.assert_array_equal(overlay[..., 3] == 0, weights == 0)
    assert set(np.unique(overlay[..., 3])) == {0, round(255 * OVERLAY_OPACITY)}
    # Colour of the largest weight is the top of the colour map; larger weights are darker.
    np.testing.assert_array_equal(overlay[2, 4, :3], colormap()(1.0, bytes=True)[:3])
    assert overlay[2, 4, :3].sum() < overlay[0, 0, :3].sum()


@pytest.mark.parametrize("zero_style", ["transparent", "white"])
def test_zero_attention_pixels_are_image_or_white_and_others_coloured(zero_style):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 200, (6, 8, 3), dtype=np.uint8)  # never pure white
    maps = _sparse_maps()
    panels = render_words(image, maps, vmax=1.0, zero_style=zero_style)
    zero = upsample_attention(maps, (6, 8)) == 0
    expected = image if zero_style == "transparent" else np.full_like(image, 255)
    for panel, z in zip(panels, zero, strict=True):
        np.testing.assert_array_equal(panel[z], expected[z])
        assert (panel[~z] != image[~z]).any(axis=-1).all()
        assert not (panel[~z] == 255).all(axis=-1).any()


def test_shared_colour_scale_gives_equal_weights_equal_colours():
    a = np.zeros((1, 2, 2), np.float32)
    a[0, 0, 0], a[0, 1, 1] = 0.3, 0.7
    b = np.full((1, 2, 2), 0.25, np.float32)
    b[0, 0, 0], b[0, 0, 1] = 0.3, 0.2
    vmax = shared_vmax([a, b])
    assert vmax == pytest.approx(0.7)
    image = np.zeros((2, 2, 3), np.uint8)
    pa = render_words(image, a, vmax=vmax)[0]
    pb = render_words(image, b, vmax=vmax)[0]
    np.testing.assert_array_equal(pa[0, 0], pb[0, 0])  # 0.3 in both models
    assert not np.array_equal(pa[1, 1], pb[1, 1])
    with pytest.raises(ValueError, match="no positive"):
        shared_vmax([np.zeros((2, 2))])
    with pytest.raises(ValueError, match="every caption is empty"):
        shared_vmax([np.zeros((0, 2, 2))])


def test_displayed_images_hold_only_mixes_of_their_own_colours():
    # A small image enlarged (and a thin one's short side stretched) gets no fringe of colours
    # it does not hold: Lanczos rang there (a cyan halo round a red pixel on grey).
    for size in ((5, 3), (8, 300)):
        pixels = np.full((size[1], size[0], 3), 128, np.uint8)
        pixels[size[1] // 2, size[0] // 2] = (255, 0, 0)
        shown = image_array(Image.fromarray(pixels)).astype(int)
        assert max(shown.shape[:2]) == 384
        red, green, blue = shown[..., 0], shown[..., 1], shown[..., 2]
        assert (green == blue).all() and (red >= green).all() and (green <= 128).all()
    # A photo larger than the figure is shrunk as before, to the same size.
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 256, (600, 800, 3), np.uint8))
    assert image_array(photo).shape == (288, 384, 3)


def test_the_strips_colour_bar_has_the_overlays_opacity(tmp_path):
    # Drawn opaque, the bar showed colours no cell over the white mask has.
    panels = np.full((2, 48, 48, 3), 128, np.uint8)
    render_strip(panels, ["a", "b"], 0.5, tmp_path / "strip.png")
    pixels = np.asarray(Image.open(tmp_path / "strip.png").convert("RGB")).astype(float)
    top = np.array(colormap()(1.0)[:3]) * 255
    shown = OVERLAY_OPACITY * top + (1 - OVERLAY_OPACITY) * 255

    def nearest(colour):
        return np.abs(pixels - colour).max(axis=-1).min()

    assert nearest(shown) <= 2 and nearest(top) > 20


def test_compose_rejects_unknown_style():
    with pytest.raises(ValueError, match="zero style"):
        compose(np.zeros((2, 2, 3), np.uint8), np.zeros((2, 2, 4), np.uint8), "blur")


def test_write_heatmaps_files_pixels_and_raw_weights_round_trip(tmp_path):
    rng = np.random.default_rng(2)
    photo = rng.integers(0, 200, (30, 40, 3), dtype=np.uint8)  # 4:3, cells of 10 x 10 px
    tokens = ["a", "red </b> 'x'", "dog"]
    maps = _sparse_maps()
    record = AttentionRecord("photo.png", "a red dog", tokens, maps, "tvmax", vmax=1.0)
    files = write_heatmaps(tmp_path, Image.fromarray(photo), record, zero_style="white",
                           max_side=40)
    names = [f.name for f in files]
    assert names == ["00_a.png", "01_red_b_x.png", "02_dog.png", "strip.png", "attention.npz",
                     "attention.json"]
    figure = np.asarray(Image.open(tmp_path / "01_red_b_x.png").convert("RGB"))
    assert figure.shape == (30, 40, 3)
    np.testing.assert_array_equal(figure[:20], 255)  # rows of zero cells: white mask
    assert not (figure[25, 35] == 255).all()  # the attended cell (2, 3) is coloured
    assert Image.open(tmp_path / "strip.png").size[0] > 40 * 3

    for path in (tmp_path / "attention.npz", tmp_path / "attention.json"):
        loaded = AttentionRecord.load(path)
        np.testing.assert_array_equal(loaded.attention, maps)
        assert loaded.tokens == tokens and loaded.grid == (3, 4)
        assert (loaded.caption, loaded.mapping, loaded.vmax) == ("a red dog", "tvmax", 1.0)
    raw = json.loads((tmp_path / "attention.json").read_text())
    assert raw["grid"] == [3, 4] and len(raw["attention"]) == 3


def test_record_rejects_mismatched_tokens(tmp_path):
    with pytest.raises(ValueError, match=r"expected shape \(2, h, w\)"):
        AttentionRecord("x", "a b", ["a", "b"], _sparse_maps(), "softmax", 1.0)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="bad.json"):
        AttentionRecord.load(bad)


def test_file_names_are_sanitized_and_deterministic(tmp_path):
    assert sanitize('<script>alert("x")</script>') == "script_alert_x_script"
    assert word_figure_name(3, "dog's") == "03_dog_s.png"
    paths = [tmp_path / "a" / "1.jpg", tmp_path / "b" / "1.jpg", tmp_path / "c d.png",
             tmp_path / "a" / "1.png"]
    stems = unique_stems(paths)
    assert stems == unique_stems(paths)
    assert stems[1:3] == ["b_1", "c_d"]
    assert stems[0].startswith("a_1-") and stems[3].startswith("a_1-") and stems[0] != stems[3]


def test_checkpoints_of_runs_are_named_after_their_runs(tmp_path):
    def run(name, version, file="last.ckpt"):
        return tmp_path / "runs" / name / f"version_{version}" / "checkpoints" / file

    assert checkpoint_names([run("coco_softmax", 0), run("coco_tvmax", 3),
                             tmp_path / "demo" / "tvmax.ckpt"]) == [
        "coco_softmax", "coco_tvmax", "tvmax"]
    assert checkpoint_names([run("a", 0), run("a", 1)]) == ["a_v0", "a_v1"]
    best = "best-epoch03-cider0.8000.ckpt"
    assert checkpoint_names([run("a", 0), run("a", 0, best)]) == [
        "a_v0_last", "a_v0_best-epoch03-cider0.8000"]
    # The same file twice, also as another path to it, is refused: its figures would go twice
    # into one folder, named with a hash.
    with pytest.raises(ValueError, match="last.ckpt is given twice; give each checkpoint once"):
        checkpoint_names([run("a", 0), run("a", 0)])
    tvmax = tmp_path / "demo" / "tvmax.ckpt"
    with pytest.raises(ValueError, match=r"tvmax.ckpt is given twice \(also as /"):
        checkpoint_names([tvmax, run("a", 0), tmp_path / "demo" / ".." / "demo" / "tvmax.ckpt"])


def test_a_strip_names_its_caption_image_and_model():
    from captioner.inference.heatmaps import strip_title

    record = AttentionRecord("/photos/dog_park.jpg", "a brown dog " * 10, ["a"],
                             np.ones((1, 2, 2), np.float32) / 4, "tvmax", 0.25)
    lines = strip_title(record, "coco_tvmax_v0").splitlines()
    assert lines[-1] == "dog_park.jpg · coco_tvmax_v0 (tvmax attention)"
    assert " ".join(lines[:-1]) == record.caption.strip() and len(lines) == 3
    empty = AttentionRecord("x.png", "", [], np.zeros((0, 2, 2), np.float32), "softmax", 1.0)
    assert strip_title(empty) == "(empty caption)\nx.png · softmax attention"
