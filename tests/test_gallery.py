"""The attention gallery: files, one colour scale, zero vs small weights, the command on a real
checkpoint, and the page in headless Chromium."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from captioner.inference.heatmaps import OVERLAY_OPACITY
from eval.commands import gallery as command
from eval.gallery import GalleryCaption, GalleryImage, GalleryModel, build_gallery

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
FAST = ["--beam-size", "1", "--max-length", "4", "--no-progress"]
INJECTED = "a </script><script>window.pwned = 1</script> & dog"
MODELS = [GalleryModel("softmax-run", "runs/softmax.ckpt", "softmax"),
          GalleryModel("tvmax-run", "runs/tvmax.ckpt", "tvmax")]


def _page_data(page: Path) -> dict:
    text = page.read_text(encoding="utf-8")
    raw = text.split('<script id="gallery-data" type="application/json">')[1]
    return json.loads(raw.split("</script>")[0])


def _images() -> list[GalleryImage]:
    """Two 30 x 40 images; model m attends to row m of a 3 x 4 grid, with weights 0.1 * (i+1)
    on image i and word w holding an extra 0.05 * w; image 1 model 1 adds a third word."""
    rng = np.random.default_rng(0)
    images = []
    for i in range(2):
        captions = []
        for m in range(len(MODELS)):
            tokens = INJECTED.split() if (i, m) == (0, 1) else ["a", "red", "star"][: 2 + i * m]
            maps = np.zeros((len(tokens), 3, 4), np.float32)
            for w in range(len(tokens)):
                maps[w, m, :2] = 0.1 * (i + 1) + 0.05 * w
            captions.append(GalleryCaption(" ".join(tokens), tokens, maps))
        pixels = rng.integers(0, 200, (30, 40, 3), dtype=np.uint8)
        images.append(GalleryImage(f"photo {i}.png", pixels, captions))
    return images


def test_gallery_files_one_overlay_per_word_and_shared_scale(tmp_path):
    images = _images()
    page = build_gallery(tmp_path, images, MODELS, title="A & B")
    data = _page_data(page)
    largest = max(float(c.attention.max()) for item in images for c in item.captions)
    assert largest == pytest.approx(0.1 + 0.05 * 5)  # image 0, model 1: the six-word caption
    assert data["vmax"] == largest and data["max_weight"] == largest and not data["vmax_given"]
    assert [m["name"] for m in data["models"]] == ["softmax-run", "tvmax-run"]
    assert [m["mapping"] for m in data["models"]] == ["softmax", "tvmax"]

    expected = set()
    for n, (item, shown) in enumerate(zip(images, data["images"], strict=True), start=1):
        assert shown["name"] == item.name and shown["src"] == f"images/{n:04d}.jpg"
        assert (shown["width"], shown["height"]) == (40, 30)
        for m, (caption, entry) in enumerate(zip(item.captions, shown["captions"], strict=True)):
            assert entry["text"] == caption.text
            assert [w["word"] for w in entry["words"]] == caption.tokens
            names = [f"attention/{n:04d}_{m:02d}_{w:02d}.png" for w in range(len(caption.tokens))]
            assert [w["overlay"] for w in entry["words"]] == names
            expected.update(names)
    assert {f"attention/{p.name}" for p in (tmp_path / "attention").iterdir()} == expected
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == ["0001.jpg", "0002.jpg"]
    assert Image.open(tmp_path / "images" / "0001.jpg").size == (40, 30)

    # Every overlay on the page's one scale: the darkest green exactly at the largest weight.
    darkest = np.asarray(Image.open(tmp_path / "attention" / "0001_01_05.png"))
    lighter = np.asarray(Image.open(tmp_path / "attention" / "0002_00_01.png"))
    bar = np.asarray(Image.open(tmp_path / "colorbar.png"))
    assert (darkest[10, 0] == bar[0, -1]).all()  # weight 0.35 = vmax: the bar's right end
    assert lighter[0, 0, :3].astype(int).sum() > darkest[10, 0, :3].astype(int).sum()

    text = page.read_text(encoding="utf-8")
    assert len(re.findall(r"<script", text)) == 2 and "<title>A &amp; B</title>" in text
    assert data["images"][0]["captions"][1]["text"] == INJECTED


def test_zero_attention_transparent_small_attention_not(tmp_path):
    maps = np.zeros((1, 2, 2), np.float32)
    maps[0, 0, 0], maps[0, 1, 1] = 1e-6, 1.0  # (0, 1) and (1, 0) are exactly zero
    image = GalleryImage("x.png", np.full((20, 20, 3), 90, np.uint8),
                         [GalleryCaption("dot", ["dot"], maps)])
    opaque = round(255 * OVERLAY_OPACITY)
    for style in ("transparent", "white"):
        out = tmp_path / style
        build_gallery(out, [image], MODELS[:1], zero_style=style, vmax=0.5)
        overlay = np.asarray(Image.open(out / "attention" / "0001_00_00.png"))
        assert overlay.shape == (20, 20, 4)
        small, zero, large = overlay[5, 5], overlay[5, 15], overlay[15, 15]
        assert small[3] == opaque and large[3] == opaque  # every non-zero weight coloured
        assert tuple(small[:3]) != (255, 255, 255) and (small[:3] != large[:3]).any()
        if style == "transparent":
            assert zero[3] == 0 and (overlay[:10, 10:, 3] == 0).all()
        else:
            assert (overlay[:10, 10:] == 255).all() and (overlay[10:, :10] == 255).all()
        data = _page_data(out / "index.html")
        assert data["zero_style"] == style
        assert data["vmax"] == 0.5 and data["vmax_given"] and data["max_weight"] == 1.0
        assert data["hue"] == "green"


def test_another_colour_map_colours_the_overlays_the_bar_and_the_legend(tmp_path):
    maps = np.ones((1, 2, 2), np.float32)
    image = GalleryImage("x.png", np.full((20, 20, 3), 90, np.uint8),
                         [GalleryCaption("dot", ["dot"], maps)])
    build_gallery(tmp_path, [image], MODELS[:1], colours="Blues")
    overlay = np.asarray(Image.open(tmp_path / "attention" / "0001_00_00.png"))
    bar = np.asarray(Image.open(tmp_path / "colorbar.png"))
    red, green, blue = overlay[0, 0, :3].astype(int)
    assert blue > green > red  # the darkest blue of matplotlib's Blues
    assert (bar[0, -1] == overlay[0, 0]).all()  # the bar's right end: weight 1 = vmax
    assert _page_data(tmp_path / "index.html")["hue"] == "blue"


def test_gallery_rejects_inconsistent_input(tmp_path):
    images = _images()
    with pytest.raises(ValueError, match="2 captions for 1 models"):
        build_gallery(tmp_path, images, MODELS[:1])
    bad = GalleryImage("y.png", images[0].pixels,
                       [GalleryCaption("a b", ["a", "b"], np.ones((3, 2, 2)))] * 2)
    with pytest.raises(ValueError, match=r"shape \(3, 2, 2\) for 2 tokens"):
        build_gallery(tmp_path, [bad], MODELS)
    with pytest.raises(ValueError, match="at least one image"):
        build_gallery(tmp_path, [], MODELS)
    empty = GalleryImage("z.png", images[0].pixels,
                         [GalleryCaption("", [], np.zeros((0, 3, 4), np.float32))] * 2)
    with pytest.raises(ValueError, match="every caption is empty"):
        build_gallery(tmp_path, [empty], MODELS)  # no weight to choose vmax from
    assert not (tmp_path / "index.html").exists()
    data = _page_data(build_gallery(tmp_path, [empty], MODELS, vmax=0.5))
    assert data["max_weight"] == 0.0 and data["images"][0]["captions"][0]["words"] == []


@pytest.fixture(scope="module")
def command_gallery(tiny_checkpoint, synthetic_data, tmp_path_factory):
    """``captioner gallery`` on the four synthetic test images and an unreadable file, with the
    tiny checkpoint twice (as ``tiny`` and ``second``): (exit code, stderr, out, inputs)."""
    tmp = tmp_path_factory.mktemp("gallery")
    second = tmp / "second.ckpt"
    shutil.copy(tiny_checkpoint, second)
    broken = tmp / "broken.png"
    broken.write_bytes(b"\x89PNG not really")
    folder = synthetic_data.image_root / "test"
    out = tmp / "out"
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = command.main([str(folder), str(broken), "--ckpt", str(tiny_checkpoint),
                             "--ckpt", str(second), "--out", str(out), *FAST])
    return code, stderr.getvalue(), out, sorted(folder.glob("*.png"))


def test_command_on_two_models(command_gallery, tiny_checkpoint):
    from captioner.inference.pipeline import open_captioner

    code, err, out, inputs = command_gallery
    assert code == 1  # the unreadable file is reported by name, the page still written
    total = len(inputs) + 1  # the folder's images and broken.png
    assert "broken.png" in err
    assert f"1 of {total} images could not be read (each is named above)" in err
    data = _page_data(out / "index.html")
    assert [m["name"] for m in data["models"]] == [tiny_checkpoint.stem, "second"]
    assert [m["mapping"] for m in data["models"]] == ["tvmax", "tvmax"]
    assert [i["name"] for i in data["images"]] == [str(p) for p in inputs]
    # Reference: the same checkpoint called directly with the same decoding options.
    captioner = open_captioner(tiny_checkpoint, "cpu")
    options = replace(captioner.decoding, beam_size=1, max_length=4)
    reference = captioner.caption(inputs, options)
    overlays = []
    for shown, caption in zip(data["images"], reference, strict=True):
        assert [c["text"] for c in shown["captions"]] == [caption.text] * 2
        for entry in shown["captions"]:
            assert [w["word"] for w in entry["words"]] == caption.tokens
            overlays += [w["overlay"] for w in entry["words"]]
    assert overlays and all((out / o).is_file() for o in overlays)
    assert len(list((out / "attention").iterdir())) == len(overlays)
    assert data["vmax"] == pytest.approx(max(float(c.attention.max()) for c in reference))


def test_command_samples_a_karpathy_split(tiny_checkpoint, synthetic_data, tmp_path):
    out = tmp_path / "out"
    code = command.main(["--data", str(synthetic_data.karpathy_json), "--images",
                         str(synthetic_data.image_root), "--split", "val", "--n", "2",
                         "--ckpt", str(tiny_checkpoint), "--out", str(out), *FAST])
    assert code == 0
    names = [i["name"] for i in _page_data(out / "index.html")["images"]]
    assert len(names) == 2 and all(re.fullmatch(r"synthetic_val_\d+\.png \(id \d+\)", n)
                                   for n in names)


def test_command_user_errors(tiny_checkpoint, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = command.main([str(tmp_path), "--ckpt", str(tiny_checkpoint),
                         "--out", str(blocker / "out"), *FAST])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a folder" in err
    with pytest.raises(SystemExit) as exit_info:
        command.main(["--ckpt", str(tiny_checkpoint), "--out", str(tmp_path / "o")])
    assert exit_info.value.code == 2 and "IMAGE_OR_DIR or --data" in capsys.readouterr().err
    code = command.main([str(tmp_path), "--ckpt", str(tiny_checkpoint), "--ckpt",
                         str(tiny_checkpoint), "--out", str(tmp_path / "o"), *FAST])
    assert code == 2 and not (tmp_path / "o").exists()
    assert capsys.readouterr().err == (f"captioner gallery: checkpoint {tiny_checkpoint} is "
                                       "given twice; give each checkpoint once\n")


def test_command_refuses_a_reused_out_or_replaces_it_wholly(tiny_checkpoint, synthetic_data,
                                                           tmp_path, capsys):
    images = sorted((synthetic_data.image_root / "test").glob("*.png"))
    out = tmp_path / "out"
    args = ["--ckpt", str(tiny_checkpoint), "--out", str(out), *FAST]
    assert command.main([*map(str, images[:3]), *args]) == 0
    assert capsys.readouterr().out == (f"gallery of 3 images x 1 model: {out / 'index.html'}\n")
    assert command.main([str(images[3]), *args]) == 2
    assert capsys.readouterr().err == (
        f"captioner gallery: {out}: holds the gallery of an earlier run ({out / 'index.html'}); "
        "choose a new or empty folder, or pass --overwrite to replace it\n")
    assert len(list((out / "images").iterdir())) == 3

    assert command.main([str(images[3]), *args, "--overwrite"]) == 0
    data = _page_data(out / "index.html")
    assert [i["name"] for i in data["images"]] == [str(images[3])]
    assert [p.name for p in (out / "images").iterdir()] == ["0001.jpg"]
    overlays = {w["overlay"] for c in data["images"][0]["captions"] for w in c["words"]}
    assert {f"attention/{p.name}" for p in (out / "attention").iterdir()} == overlays


def test_command_says_when_fewer_images_than_n_exist(tiny_checkpoint, synthetic_data, tmp_path,
                                                     capsys):
    code = command.main(["--data", str(synthetic_data.karpathy_json), "--images",
                         str(synthetic_data.image_root), "--split", "val", "--n", "30",
                         "--ckpt", str(tiny_checkpoint), "--out", str(tmp_path / "split"),
                         *FAST])
    assert code == 0
    note = re.fullmatch(r"captioner gallery: --n 30 but the val split has only (\d+) images; "
                        r"showing those \1\n", capsys.readouterr().err)
    assert note and len(_page_data(tmp_path / "split" / "index.html")["images"]) == int(
        note.group(1))

    images = sorted((synthetic_data.image_root / "test").glob("*.png"))[:2]
    code = command.main([*map(str, images), "--n", "5", "--ckpt", str(tiny_checkpoint),
                         "--out", str(tmp_path / "files"), *FAST])
    assert code == 0
    assert capsys.readouterr().err == ("captioner gallery: --n 5 but IMAGE_OR_DIR holds only 2 "
                                       "images; showing all 2\n")


def test_command_refuses_an_images_root_where_no_image_of_the_split_is(
    tiny_checkpoint, synthetic_data, tmp_path, capsys
):
    wrong = synthetic_data.image_root / "test"  # the split's folder, not the image root
    code = command.main(["--data", str(synthetic_data.karpathy_json), "--images", str(wrong),
                         "--ckpt", str(tiny_checkpoint), "--out", str(tmp_path / "gallery"),
                         *FAST])
    assert code == 2 and not (tmp_path / "gallery").exists()
    [line] = capsys.readouterr().err.splitlines()
    assert re.fullmatch(
        rf"captioner gallery: --images {re.escape(str(wrong))}: none of the 4 images of the "
        rf"test split is readable \({re.escape(str(wrong / 'test'))}/\S+: file not found; "
        rf".+: file not found and 2 more\)", line), line


@pytest.mark.browser
def test_browser_navigation_hash_and_screenshot(command_gallery):
    """Open the command's gallery from file://: captions shown, right arrow -> image 2."""
    from playwright.sync_api import expect, sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (.ci/run does)")
    _, _, out, _ = command_gallery
    data = _page_data(out / "index.html")
    shot = out.parent / "gallery.png"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                             args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            problems: list[str] = []
            page.on("console", lambda m: m.type == "error" and problems.append(m.text))
            page.on("pageerror", lambda e: problems.append(f"error {e}"))
            page.on("request", lambda r: r.url.startswith(("file:", "data:", "blob:")) or
                    problems.append(f"network request {r.url}"))
            page.goto((out / "index.html").as_uri())
            page.wait_for_load_state("load")
            shown = [c["text"] for c in data["images"][0]["captions"]]
            assert page.locator(".caption").all_inner_texts() == shown
            assert page.locator("#position").inner_text() == "Image 1 of 4"
            assert page.evaluate("location.hash") == "#1"
            assert page.evaluate("[...document.querySelectorAll('#item img, #colorbar')]"
                                 ".every(i => i.complete && i.naturalWidth > 0)")
            page.screenshot(path=str(shot), full_page=True)

            page.keyboard.press("ArrowRight")
            assert page.evaluate("location.hash") == "#2"
            # The page renders on the hashchange event, which fires after the key press.
            expect(page.locator("#position")).to_have_text("Image 2 of 4")
            assert page.locator(".image-name").inner_text() == data["images"][1]["name"]
            page.keyboard.press("k")
            assert page.evaluate("location.hash") == "#1"
            page.goto((out / "index.html").as_uri() + "#3")  # a shared link opens image 3
            assert page.locator("#position").inner_text() == "Image 3 of 4"
            page.click(".word >> nth=0")  # pins the large view
            # Off every word (a word under the pointer shows its large view on hover).
            page.mouse.move(1, 1)
            assert page.locator("#large").is_visible()
            page.keyboard.press("Escape")
            page.locator("#large").wait_for(state="hidden", timeout=2000)
            assert problems == []
        finally:
            browser.close()
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert Image.open(shot).format == "PNG" and pixels.shape[0] > 100
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # text, images, overlays


def test_command_refuses_an_out_inside_the_image_root_of_a_karpathy_split(
        tiny_checkpoint, synthetic_data, tmp_path, capsys):
    # Its figures would be read as images by the next command given that root.
    images = tmp_path / "images"
    shutil.copytree(synthetic_data.image_root, images)
    out = images / "gallery"
    code = command.main(["--data", str(synthetic_data.karpathy_json), "--images", str(images),
                         "--split", "val", "--n", "2", "--ckpt", str(tiny_checkpoint),
                         "--out", str(out), *FAST])
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err == (
        f"captioner gallery: {out}: the output folder lies inside the input folder {images}, so "
        "its figures would be read as input images by the next run; choose an --out outside "
        "the inputs\n")


def test_a_split_gallery_shows_references_and_each_captions_cider(tiny_checkpoint,
                                                                   synthetic_data, tmp_path):
    """With --data every image shows its reference captions and every caption its CIDEr-D,
    whose IDF weights are the whole split's (pycocoevalcap's Cider over the split, the images
    not shown given no caption), as the test scores' are."""
    from pycocoevalcap.cider.cider import Cider

    from data_prep.karpathy import load_karpathy

    out = tmp_path / "out"
    code = command.main(["--data", str(synthetic_data.karpathy_json), "--images",
                         str(synthetic_data.image_root), "--split", "test", "--n", "3",
                         "--ckpt", str(tiny_checkpoint), "--out", str(out), *FAST])
    assert code == 0
    entries = load_karpathy(synthetic_data.karpathy_json, synthetic_data.image_root).split("test")
    references = {e.image_id: [" ".join(tokens) for tokens in e.sentences] for e in entries}
    images = _page_data(out / "index.html")["images"]
    assert len(images) == 3
    for image in images:
        image_id = int(re.fullmatch(r".* \(id (\d+)\)", image["name"]).group(1))
        assert image["references"] == references[image_id] and len(image["references"]) >= 1
        hypotheses = {i: [""] for i in references}
        hypotheses.update({int(re.fullmatch(r".* \(id (\d+)\)", other["name"]).group(1)):
                           [other["captions"][0]["text"]] for other in images})
        _, scores = Cider().compute_score(references, hypotheses)
        expected = dict(zip(hypotheses, scores, strict=True))[image_id]
        assert image["captions"][0]["cider"] == pytest.approx(float(expected), abs=1e-12)
    # Files given as IMAGE_OR_DIR have no references, and no score.
    files = tmp_path / "files"
    assert command.main([str(entries[0].path), "--ckpt", str(tiny_checkpoint), "--out",
                         str(files), *FAST]) == 0
    [image] = _page_data(files / "index.html")["images"]
    assert image["references"] == [] and image["captions"][0]["cider"] is None


def test_pages_render_from_a_folder_holding_an_eval_folder(tmp_path, monkeypatch):
    """``captioner evaluate --out eval`` leaves an ``eval/`` in the working folder, which a
    look-up of the package ``eval`` by name finds first: the templates are not looked for there.
    """
    import subprocess
    import sys

    (tmp_path / "eval").mkdir()
    run = subprocess.run([sys.executable, "-c", "from eval.static_page import render_page; "
                          "print(len(render_page('gallery', {'images': []}, 'title')))"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) > 1000


def test_split_images_sharing_a_file_name_are_named_by_their_path_under_the_root(tmp_path):
    from data_prep.karpathy import load_karpathy
    from eval.gallery import split_image_names

    def record(folder, name, image_id):
        return {"filepath": folder, "filename": name, "cocoid": image_id, "imgid": image_id,
                "split": "val", "sentences": [{"raw": "a dog", "tokens": ["a", "dog"]}]}

    split = tmp_path / "dataset_coco.json"
    split.write_text(json.dumps({"dataset": "coco", "images": [
        record("train2014", "1.jpg", 11), record("val2014", "1.jpg", 12),
        record("val2014", "2.jpg", 13), record("", "3.jpg", 14)]}))
    root = tmp_path / "coco images"
    entries = load_karpathy(split, root).split("val")
    assert split_image_names(entries, root) == [
        "train2014/1.jpg (id 11)", "val2014/1.jpg (id 12)", "2.jpg (id 13)", "3.jpg (id 14)"]
