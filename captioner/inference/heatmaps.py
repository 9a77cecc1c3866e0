"""Per-word attention heatmaps: exact rendering of output attention over the image.

Martins et al., *Sparse and Structured Visual Attention* (Figures 1, 3-5 and appendix B) show,
for every generated word, the output attention alpha~_t over the h x w feature grid drawn on
top of the image: the darker the green (or the colour a user picks, ``COLORMAPS``), the higher
the weight; zero attention is either a hard white mask (the paper's figures) or fully
transparent (the human study, so that raters are not biased). This module draws exactly that
and nothing more:

* the whole image is shown, its longer side scaled to ``max_side`` pixels, with its own aspect
  ratio up to ``MAX_ASPECT`` (4:1). A longer or taller image (a 10000 x 20 panorama) is
  stretched along its short side to exactly 4:1 (384 x 96 px by default) instead of becoming a
  384 x 1 px line: every part stays visible and every grid cell keeps a readable size. The
  encoder saw the image stretched to a square anyway, so the figure distorts less than the
  model's own view;
* grid cell (i, j) covers rows [i*H/h, (i+1)*H/h) and columns [j*W/w, (j+1)*W/w) of the
  displayed image (H x W, after any stretch), so the grid spans the whole image and stays
  aligned with it;
* the grid is upsampled without blur: ``nearest`` (default: each pixel takes the cell under
  its centre, one flat block per cell) or ``bilinear`` (pixel-centre aligned, borders clamped,
  as PIL and ``align_corners=False``); never a Gaussian, which would hide exact zeros. With
  either mode a pixel is zero exactly when every cell contributing to it is zero;
* one colour scale for everything drawn together: weight w maps to the colour
  ``colormap(name)(clip(w / vmax, 0, 1))`` with vmax chosen by the caller (`shared_vmax`: the
  largest weight of all maps in the run, all words and all models) and recorded next to the
  figures;
* zero weight is exact: such pixels get overlay alpha 0 (the image shows through unchanged) or
  pure white; non-zero weights get a colour of constant opacity `OVERLAY_OPACITY`, starting at
  a light tint (never white) so that the smallest non-zero weight stays distinguishable from
  the white mask.

Arrays: attention maps are float (T, h, w) or (h, w); images are uint8 (H, W, 3); overlays are
uint8 RGBA (H, W, 4).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from data_prep.paths import refuse_repeated
from data_prep.settings_files import parse_json
from data_prep.text import printable

if TYPE_CHECKING:
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

ZERO_STYLES = ("transparent", "white")
# Single-hue colour scales of matplotlib, light to dark, for --colormap: the paper's green, and
# others for images where green is everywhere (grass, trees, green objects).
COLORMAPS = ("Greens", "Blues", "Purples", "Reds", "Oranges", "Greys")
UPSAMPLE_MODES = ("nearest", "bilinear")
OVERLAY_OPACITY = 0.6
DEFAULT_MAX_SIDE = 384
# The smallest longer side a figure may be given: a 16x16 grid (a ResNet's at 512 px) at two
# pixels a cell; smaller figures cannot show the cells a word attends to.
MIN_MAX_SIDE = 32
# The largest: past it a figure is larger than any screen or page shows, and its pixels, with
# the attention maps upsampled to them, no longer fit in memory (100,000 px: 30 GB an image).
MAX_MAX_SIDE = 4096
# The label of an empty caption's strip, which shows the image alone.
EMPTY_CAPTION = "(empty caption)"
# Panels a row of a caption strip: 12 inches across, the width of a page or a screen; a
# longer caption wraps onto more rows rather than making a strip too wide to read.
STRIP_COLUMNS = 6
# Longest displayed side over shortest: beyond it the short side is stretched (see above).
MAX_ASPECT = 4.0


@functools.cache
def colormap(name: str = COLORMAPS[0]) -> ListedColormap:
    """The heatmaps' colour map: matplotlib's map ``name`` (one of :data:`COLORMAPS`) without
    its lightest quarter, which is near-white: every non-zero weight stays visibly coloured,
    also against the white mask. Made on first use: matplotlib is imported by what draws, not
    by the commands' options."""
    import matplotlib
    from matplotlib.colors import ListedColormap

    if name not in COLORMAPS:
        raise ValueError(f"colour map must be one of {', '.join(COLORMAPS)}, got {name!r}")
    return ListedColormap(
        matplotlib.colormaps[name](np.linspace(0.25, 1.0, 256)), name=f"{name}NZ"
    )


def hue(name: str) -> str:
    """The colour that the map ``name`` darkens, in a word: "green" for "Greens"."""
    return name.lower().removesuffix("s")


def display_size(width: int, height: int, max_side: int = DEFAULT_MAX_SIDE) -> tuple[int, int]:
    """(width, height) scaled so that the longer side is ``max_side``, aspect ratio kept up to
    ``MAX_ASPECT``; the short side of a more elongated image becomes ``max_side / MAX_ASPECT``
    (rounded up), so a 10000 x 20 panorama is displayed at 384 x 96, not 384 x 1."""
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if max_side < 1:
        raise ValueError(f"max_side must be >= 1, got {max_side}")
    scale = max_side / max(width, height)
    min_side = math.ceil(max_side / MAX_ASPECT)
    return max(min_side, round(width * scale)), max(min_side, round(height * scale))


def upsample_attention(
    attention: np.ndarray, size: tuple[int, int], mode: str = "nearest"
) -> np.ndarray:
    """Upsample attention maps to an image of ``size = (height, width)`` without blur.

    Args:
        attention: float array (T, h, w) or (h, w), non-negative.
        size: target (H, W).
        mode: ``nearest`` (each pixel takes the cell under its centre, computed in integers;
            a centre exactly on a border goes to the lower/right cell) or ``bilinear``
            (pixel-centre aligned interpolation, borders clamped; meant for enlarging).

    Returns:
        float32 array (T, H, W) or (H, W), same leading shape as the input.
    """
    if mode not in UPSAMPLE_MODES:
        raise ValueError(f"upsample mode must be one of {UPSAMPLE_MODES}, got {mode!r}")
    maps = np.asarray(attention, dtype=np.float32)
    single = maps.ndim == 2
    if single:
        maps = maps[None]
    if maps.ndim != 3 or 0 in maps.shape:
        raise ValueError(f"attention must have shape (T, h, w) or (h, w), got {maps.shape}")
    if not np.isfinite(maps).all() or (maps < 0).any():
        raise ValueError("attention weights must be finite and non-negative")
    height, width = size
    _, h, w = maps.shape
    if mode == "nearest":
        # The cell under each pixel's centre: floor((y + 0.5) * h / H), in integers.
        rows = ((2 * np.arange(height) + 1) * h) // (2 * height)
        cols = ((2 * np.arange(width) + 1) * w) // (2 * width)
        out = maps[:, rows][:, :, cols]
    else:
        import torch

        out = torch.nn.functional.interpolate(
            torch.from_numpy(maps)[:, None], size=(height, width), mode="bilinear",
            align_corners=False,
        )[:, 0].numpy()
        # Interpolating between exact zeros yields exact zeros; clamp float round-off below 0.
        out = np.maximum(out, 0.0)
    return out[0] if single else out


def shared_vmax(maps: Iterable[np.ndarray]) -> float:
    """The colour-scale maximum shared by a set of figures: the largest weight of all maps."""
    peaks = [float(np.max(m)) for m in maps if np.size(m)]
    if not peaks:
        raise ValueError("cannot choose a colour scale: every caption is empty, so there is no "
                         "attention weight to scale by; give --vmax to draw them anyway")
    if max(peaks) <= 0:
        raise ValueError("cannot choose a colour scale: no positive attention weight in the maps")
    return max(peaks)


def attention_overlay(weights: np.ndarray, vmax: float, colours: str = COLORMAPS[0]
                      ) -> np.ndarray:
    """RGBA overlay (H, W, 4) uint8 of one upsampled map (H, W) in the colour map ``colours``:
    alpha 0 exactly where w == 0."""
    if vmax <= 0:
        raise ValueError(f"vmax must be positive, got {vmax}")
    weights = np.asarray(weights, dtype=np.float32)
    rgba = colormap(colours)(np.clip(weights / vmax, 0.0, 1.0), bytes=True)
    rgba[..., 3] = np.where(weights > 0, round(255 * OVERLAY_OPACITY), 0).astype(np.uint8)
    return rgba


def compose(image: np.ndarray, overlay: np.ndarray, zero_style: str = "transparent") -> np.ndarray:
    """Alpha-blend an RGBA overlay onto an RGB image (both (H, W, ...) uint8).

    Where the overlay is fully transparent the result is the image pixel unchanged
    (``transparent``) or pure white (``white``).
    """
    if zero_style not in ZERO_STYLES:
        raise ValueError(f"zero style must be one of {ZERO_STYLES}, got {zero_style!r}")
    if image.shape[:2] != overlay.shape[:2]:
        raise ValueError(f"image {image.shape[:2]} and overlay {overlay.shape[:2]} differ in size")
    alpha = overlay[..., 3:4].astype(np.float32) / 255.0
    blended = image.astype(np.float32) * (1 - alpha) + overlay[..., :3].astype(np.float32) * alpha
    out = np.rint(blended).astype(np.uint8)
    if zero_style == "white":
        out[overlay[..., 3] == 0] = 255
    return out


def image_array(image: Image.Image, max_side: int = DEFAULT_MAX_SIDE) -> np.ndarray:
    """The image as displayed: RGB uint8 (H, W, 3) of `display_size` (longer side
    ``max_side``, short side stretched up to a 4:1 aspect ratio)."""
    width, height = display_size(*image.size, max_side=max_side)
    # Lanczos shrinks a photo sharply; enlarging (a small image, the short side of a stretched
    # one) it rings, painting fringes of colours the image does not hold: bilinear weights
    # are never negative, so every pixel stays a mix of the image's own.
    shrinking = width <= image.width and height <= image.height
    resample = Image.Resampling.LANCZOS if shrinking else Image.Resampling.BILINEAR
    return np.asarray(image.convert("RGB").resize((width, height), resample))


def render_words(
    image: np.ndarray,
    attention: np.ndarray,
    *,
    vmax: float,
    zero_style: str = "transparent",
    upsample: str = "nearest",
    colours: str = COLORMAPS[0],
) -> np.ndarray:
    """One composed figure per word: uint8 (T, H, W, 3) from image (H, W, 3) and maps (T, h, w)."""
    maps = upsample_attention(attention, image.shape[:2], upsample)
    return np.stack([compose(image, attention_overlay(m, vmax, colours), zero_style)
                     for m in maps])


def render_strip(
    panels: np.ndarray, words: Sequence[str], vmax: float, path: Path, title: str | None = None,
    text: dict[str, str] | None = None, colours: str = COLORMAPS[0],
) -> None:
    """Save the caption strip (:func:`strip_figure`) as a PNG holding ``text`` as text
    chunks."""
    figure = strip_figure(panels, words, vmax, title, colours)
    figure.savefig(path, bbox_inches="tight", metadata=text)


def strip_figure(
    panels: np.ndarray, words: Sequence[str], vmax: float, title: str | None = None,
    colours: str = COLORMAPS[0],
) -> Figure:
    """The caption strip: one panel per word (T, H, W, 3) uint8, the word below it, in rows
    of at most `STRIP_COLUMNS` panels, ``title`` above and one colour bar of the attention
    weight beside them all."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    if len(panels) != len(words):
        raise ValueError(f"{len(panels)} panels but {len(words)} words")
    count = max(1, len(panels))
    columns = min(count, STRIP_COLUMNS)
    rows = math.ceil(count / columns)
    height, width = panels.shape[1:3] if len(panels) else (1, 1)
    panel_w = 2.0
    panel_h = panel_w * height / width
    row_gap = 0.4  # inches between rows of panels: the words under the upper row
    fig = Figure(figsize=(panel_w * columns + 0.9, rows * panel_h + (rows - 1) * row_gap + 0.9),
                 dpi=100)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(rows, columns + 1, width_ratios=[1] * columns + [0.06], wspace=0.05,
                            hspace=row_gap / panel_h)
    axes = []
    for i, (panel, word) in enumerate(zip(panels, words, strict=True)):
        ax = fig.add_subplot(grid[i // columns, i % columns])
        axes.append(ax)
        ax.imshow(panel, interpolation="nearest")
        # A thin frame keeps the panel's extent visible where the white mask meets the page.
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_edgecolor("0.7")
        ax.text(0.5, -0.04, word, transform=ax.transAxes, ha="center", va="top", fontsize=12,
                parse_math=False)
    colorbar_ax = fig.add_subplot(grid[:, columns])
    if axes:
        # Match the colour bar's height to the panels, which keep the image's aspect ratio.
        for ax in (axes[0], axes[-1]):
            ax.apply_aspect()
        top, bottom = axes[0].get_position(), axes[-1].get_position()
        bar_box = colorbar_ax.get_position()
        colorbar_ax.set_position([bar_box.x0, bottom.y0, bar_box.width, top.y1 - bottom.y0])
    # At the overlays' opacity, over the page's white: the colours of the panels' cells
    # where they lie over white (the mask), as the gallery's colour bar draws them.
    fig.colorbar(ScalarMappable(Normalize(0.0, vmax), colormap(colours)), cax=colorbar_ax,
                 label="attention weight", alpha=OVERLAY_OPACITY)
    if title:
        fig.suptitle(title, parse_math=False)
    return fig


@dataclass
class AttentionRecord:
    """The raw output attention behind a set of figures, so that plots can be redone.

    Attributes:
        source: image path or id. caption: the caption text. tokens: T generated words.
        attention: float32 (T, h, w), one map per token. mapping: attention mapping name.
        vmax: colour-scale maximum the figures used.
    """

    source: str
    caption: str
    tokens: list[str]
    attention: np.ndarray
    mapping: str
    vmax: float

    def __post_init__(self) -> None:
        self.attention = np.asarray(self.attention, dtype=np.float32)
        if self.attention.ndim != 3 or self.attention.shape[0] != len(self.tokens):
            raise ValueError(
                f"attention of {self.source}: expected shape ({len(self.tokens)}, h, w) for "
                f"{len(self.tokens)} tokens, got {self.attention.shape}"
            )

    @property
    def grid(self) -> tuple[int, int]:
        return int(self.attention.shape[1]), int(self.attention.shape[2])

    def to_json(self) -> dict:
        return {
            "source": self.source, "caption": self.caption, "tokens": list(self.tokens),
            "mapping": self.mapping, "vmax": self.vmax, "grid": list(self.grid),
            "attention": self.attention.tolist(),
        }

    def save(self, stem: Path) -> tuple[Path, Path]:
        """Write ``stem.npz`` (exact float32 arrays) and ``stem.json`` (the same, as lists)."""
        npz, js = stem.with_suffix(".npz"), stem.with_suffix(".json")
        np.savez(
            npz, attention=self.attention, tokens=np.array(self.tokens, dtype=str),
            grid=np.array(self.grid), source=self.source, caption=self.caption,
            mapping=self.mapping, vmax=np.float64(self.vmax),
        )
        js.write_text(json.dumps(self.to_json()), encoding="utf-8")
        return npz, js

    @classmethod
    def load(cls, path: Path) -> AttentionRecord:
        """Read a record written by `save`, from its ``.npz`` or its ``.json`` file."""
        path = Path(path)
        try:
            if path.suffix == ".npz":
                with np.load(path, allow_pickle=False) as data:
                    return cls(str(data["source"]), str(data["caption"]),
                               [str(t) for t in data["tokens"]], data["attention"],
                               str(data["mapping"]), float(data["vmax"]))
            data = parse_json(path.read_text(encoding="utf-8"))
            attention = np.asarray(data["attention"], dtype=np.float32).reshape(
                len(data["tokens"]), *data["grid"]
            )
            return cls(data["source"], data["caption"], list(data["tokens"]), attention,
                       data["mapping"], float(data["vmax"]))
        except (KeyError, ValueError, OSError) as exc:
            raise ValueError(f"{path}: not a readable attention record ({exc})") from exc


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def sanitize(text: str, max_length: int = 60) -> str:
    """A file-name-safe form of ``text``: runs of other characters become ``_``."""
    safe = _UNSAFE.sub("_", text).strip("._") or "_"
    return safe[:max_length]


def unique_stems(paths: Sequence[Path]) -> list[str]:
    """Sanitized file stems, made unique deterministically: a stem shared by several paths
    gets its parent folder's name in front (``a/1.jpg`` -> ``a_1``), and if that is still
    shared, a short hash of the full path behind."""
    paths = [Path(p) for p in paths]
    stems = [sanitize(p.stem) for p in paths]
    stems = [
        sanitize(f"{p.parent.name}_{p.stem}") if stems.count(stem) > 1 else stem
        for stem, p in zip(stems, paths, strict=True)
    ]
    return [
        f"{stem}-{hashlib.sha1(str(p).encode()).hexdigest()[:8]}" if stems.count(stem) > 1
        else stem
        for stem, p in zip(stems, paths, strict=True)
    ]


def checkpoint_names(paths: Sequence[Path]) -> list[str]:
    """Names of checkpoints for folders, pages and tables, unique and deterministic: a run's
    checkpoint (``ROOT/NAME/version_N/checkpoints/F.ckpt``, as ``fit`` writes) is ``NAME``, then
    ``NAME_vN``, then ``NAME_vN_F`` where that is shared; any other file is named as
    :func:`unique_stems` names it (``last`` of three runs was ``checkpoints_last-<hash>``).

    Raises:
        ValueError: a checkpoint given twice (also as another path to the same file): its
            figures would go twice into one folder, under a name made unique by hashing.
    """
    from captioner.training.folders import version_number

    paths = [Path(p) for p in paths]
    refuse_repeated(paths, "checkpoint")
    levels = []
    for path, stem in zip(paths, unique_stems(paths), strict=True):
        folder = path.parent
        version = version_number(folder.parent) if folder.name == "checkpoints" else None
        if version is None:
            levels.append([stem] * 3)
        else:
            run = folder.parent.parent.name
            levels.append([sanitize(name) for name in
                           (run, f"{run}_v{version}", f"{run}_v{version}_{path.stem}")])
    names = [level[0] for level in levels]
    for depth in (1, 2):
        names = [level[depth] if names.count(name) > 1 else name
                 for name, level in zip(names, levels, strict=True)]
    return [f"{name}-{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
            if names.count(name) > 1 else name for name, path in zip(names, paths, strict=True)]


def index_entries(folder: Path) -> set[str]:
    """The files under ``folder`` that a heatmaps run wrote, relative to it, as its
    ``index.json`` lists them (``{"images": [{"files": ["MODEL/STEM/00_a.png", ...]}, ...]}``):
    the index and every figure and weights file; the index alone when it cannot be read, so
    that nothing it does not list is taken for the run's."""
    try:
        index = parse_json((folder / "index.json").read_text(encoding="utf-8"))
        files = [Path(name).as_posix() for image in index["images"] for name in image["files"]]
        return {"index.json", *files}
    except (OSError, ValueError, KeyError, TypeError):
        return {"index.json"}


def word_figure_name(index: int, word: str) -> str:
    """``NN_word.png``: the word's position in the caption, then the sanitized word."""
    return f"{index:02d}_{sanitize(word, 40)}.png"


def is_heatmaps_file(name: str) -> bool:
    """Whether a file named ``name`` is one :func:`write_heatmaps` writes (a word's figure,
    the strip, the raw weights)."""
    return (name in ("strip.png", "attention.npz", "attention.json")
            or re.fullmatch(r"\d{2,}_.+\.png", name) is not None)


def strip_title(record: AttentionRecord, model: str | None = None) -> str:
    """What a caption strip says above its panels: the caption (folded to lines of about 80
    characters), then the image's file name and the model with its attention mapping."""
    caption = textwrap.fill(record.caption or EMPTY_CAPTION, 80)
    source = Path(record.source).name or record.source
    who = f"{model} ({record.mapping} attention)" if model else f"{record.mapping} attention"
    return f"{caption}\n{source} · {who}"


def _png_text(value: str) -> str:
    """``value`` as a PNG text chunk holds it: control characters escaped (a file name may
    hold a newline), and a file name's bytes that are not UTF-8 as ``\\udcNN``."""
    return printable(value).encode("utf-8", "backslashreplace").decode("utf-8")


def figure_text(record: AttentionRecord, model: str | None = None,
                zero_style: str = "transparent", index: int | None = None,
                colours: str = COLORMAPS[0]) -> dict[str, str]:
    """What a figure of ``record`` says of itself, as PNG text chunks (``Image.open(path).text``;
    image viewers show ``Title`` and ``Description``): the caption, the image, the model (the
    checkpoint's name, as :func:`checkpoint_names` gives it) with its attention mapping, the
    colour scale, and for the figure of word ``index`` that word and its place in the caption.
    A word's figure holds in its pixels the image and the word's attention alone, to compose
    figures from; ``strip.png`` shows the same with the words written and the colour bar drawn.
    """
    who = f"{model} ({record.mapping} attention)" if model else f"{record.mapping} attention"
    image = Path(record.source).name or record.source
    zero = "white" if zero_style == "white" else "transparent (the image shows)"
    text = {"Title": f"{image} · {who}"}
    if index is not None:
        word, position = record.tokens[index], f"word {index + 1} of {len(record.tokens)}"
        text = {"Title": f"{word} · {position} · {text['Title']}", "Word": word,
                "Position": position}
    text |= {
        "Description": record.caption or EMPTY_CAPTION,
        "Caption": record.caption,
        "Image": record.source,
        **({"Model": model} if model else {}),
        "Attention": f"{record.mapping} output attention",
        "Colour scale": (f"attention weight 0..{record.vmax:.6g}, the darker the {hue(colours)} "
                         f"the higher (opacity {OVERLAY_OPACITY}); zero weight {zero}"),
        "Software": "captioner heatmaps",
    }
    return {key: _png_text(value) for key, value in text.items()}


def save_word_figure(panel: np.ndarray, path: Path, text: dict[str, str]) -> None:
    """Save one word's panel, uint8 (H, W, 3), as a PNG holding ``text`` as text chunks."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for key, value in text.items():
        info.add_text(key, value)  # iTXt (UTF-8) where Latin-1 cannot hold the value
    Image.fromarray(panel).save(path, pnginfo=info)


def write_heatmaps(
    out_dir: Path,
    image: Image.Image,
    record: AttentionRecord,
    *,
    zero_style: str = "transparent",
    upsample: str = "nearest",
    max_side: int = DEFAULT_MAX_SIDE,
    model: str | None = None,
    colours: str = COLORMAPS[0],
) -> list[Path]:
    """Write one figure per word, the caption strip and the raw weights into ``out_dir``, the
    weights drawn in the colour map ``colours`` (:data:`COLORMAPS`).

    Files: ``NN_word.png`` per word (the image with the word's attention over it, at the
    image's aspect ratio, to compose figures from; its word, caption, image, model and colour
    scale in PNG text chunks, :func:`figure_text`), ``strip.png`` (every word's panel under the
    caption, the image's file name and the ``model`` with its mapping, and the colour bar; the
    same text chunks but the word's), ``attention.npz`` and ``attention.json``.
    An empty caption has no word to draw: its strip shows the image alone, marked
    ``(empty caption)``, and its raw weights hold no map. Returns the written paths.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    base = image_array(image, max_side)
    written = []
    if record.tokens:
        panels = render_words(base, record.attention, vmax=record.vmax, zero_style=zero_style,
                              upsample=upsample, colours=colours)
        for index, (panel, word) in enumerate(zip(panels, record.tokens, strict=True)):
            path = out_dir / word_figure_name(index, word)
            save_word_figure(panel, path, figure_text(record, model, zero_style, index, colours))
            written.append(path)
        words = record.tokens
    else:
        panels, words = base[None], [EMPTY_CAPTION]
    strip = out_dir / "strip.png"
    render_strip(panels, words, record.vmax, strip, title=strip_title(record, model),
                 text=figure_text(record, model, zero_style, colours=colours), colours=colours)
    written.append(strip)
    written.extend(record.save(out_dir / "attention"))
    return written
