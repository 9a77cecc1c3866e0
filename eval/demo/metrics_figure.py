"""The demo's comparison as a picture: one panel per metric of ``eval.table.SEED_TABLE_ROWS``,
a bar per mapping at its mean over the seeds, the standard deviation as an error bar and each
seed's value as a dot (so that two seeds that disagree are seen, not averaged away). Every
metric there is non-negative, so each panel's axis starts at 0, where an error bar of a
spread wider than its mean is cut."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from eval.table import computed_rows, mean_and_sd

COLOURS = {"softmax": "#4c72b0", "sparsemax": "#dd8452", "tvmax": "#55a868"}
PANELS_PER_ROW = 4


def plot_seed_metrics(per_seed: Mapping[int, Mapping[str, Mapping[str, float]]],
                      path: str | Path, title: str) -> Path:
    """Write the figure of ``per_seed[seed][mapping][metric]`` to ``path`` (PNG); metrics not
    computed get no panel. Returns ``path``."""
    import matplotlib.pyplot as plt

    from data_prep.atomic import atomic_write

    fig = seed_metrics_figure(per_seed, title)
    with atomic_write(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)
    return Path(path)


def seed_metrics_figure(per_seed: Mapping[int, Mapping[str, Mapping[str, float]]], title: str):
    """The matplotlib Figure that :func:`plot_seed_metrics` writes (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = computed_rows(per_seed)
    n_rows = math.ceil(len(rows) / PANELS_PER_ROW)
    fig, axes = plt.subplots(n_rows, PANELS_PER_ROW, figsize=(3.2 * PANELS_PER_ROW, 2.6 * n_rows),
                             squeeze=False)
    for ax, ((label, _, scale, _), values) in zip(axes.flat, rows, strict=False):
        for x, (mapping, seeds) in enumerate(values.items()):
            mean, sd = mean_and_sd(seeds)
            colour = COLOURS.get(mapping, "#8c8c8c")
            ax.bar(x, mean * scale, color=colour, alpha=0.75, yerr=None if math.isnan(sd)
                   else sd * scale, capsize=4)
            ax.plot([x] * len(seeds), [v * scale for v in seeds], "o", color="black",
                    markersize=3)
        ax.set_xticks(range(len(values)), list(values), fontsize=8)
        ax.set_title(label, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.tick_params(axis="y", labelsize=8)
    for ax in axes.flat[len(rows):]:
        ax.axis("off")
    if len(per_seed) > 1:
        title += " (bars: mean over the seeds; error bars: sd; dots: each seed)"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
