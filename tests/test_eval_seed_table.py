"""The demo's comparison over seeds: mean and sd by hand, the table and the figure."""

from __future__ import annotations

import math

import pytest
from PIL import Image

from eval.demo.metrics_figure import plot_seed_metrics, seed_metrics_figure
from eval.table import format_seed_table, format_table1, mean_and_sd, undefined_for_some_seeds


def _run(cider: float, recall: float) -> dict[str, float]:
    return {"CIDEr": cider, "object_recall": recall}


PER_SEED = {
    0: {"softmax": _run(1.0, 0.90), "tvmax": _run(1.2, 0.80)},
    1: {"softmax": _run(1.2, 0.94), "tvmax": _run(1.5, 0.84)},
    2: {"softmax": _run(1.4, 0.92), "tvmax": _run(1.8, math.nan)},
}


def test_table1_keeps_a_value_wider_than_its_column_apart_from_its_neighbour():
    # A caption of "a " * 20000 has a REP of 300065: it ran into METEOR's '-' as "-300065.00".
    table = format_table1({"long": {"Bleu_4": 0.0, "REP": 300065.0},
                           "paper": {"SPICE": 0.184, "CIDEr": 0.967, "ROUGE_L": 0.529,
                                     "Bleu_4": 0.299, "METEOR": 0.249, "REP": 3.76}})
    header, long, paper = table.splitlines()
    assert header.split() == ["SPICE", "CIDEr", "ROUGE_L", "BLEU4", "METEOR", "REP"]
    assert long.split() == ["long", "-", "-", "-", "0.0", "-", "300065.00"]
    assert paper.split() == ["paper", "18.4", "0.967", "52.9", "29.9", "24.9", "3.76"]
    assert len(header) == len(paper)


def test_mean_and_sd_by_hand():
    assert mean_and_sd([1.0, 1.2, 1.4]) == pytest.approx((1.2, 0.2))  # sample sd (n - 1)
    mean, sd = mean_and_sd([2.0])
    assert mean == 2.0 and math.isnan(sd)  # a single value has no sample sd
    assert mean_and_sd([0.8, math.nan, 0.84]) == pytest.approx((0.82, math.sqrt(0.0008)))
    assert all(math.isnan(v) for v in mean_and_sd([math.nan]))


def test_seed_table_rows_are_metrics_and_cells_mean_plus_minus_sd():
    lines = format_seed_table(PER_SEED).splitlines()
    assert lines[0].split() == ["softmax", "tvmax"]
    assert lines[1].split() == ["CIDEr", "1.200", "±", "0.200", "1.500", "±", "0.300"]
    assert lines[2].split() == ["object", "recall", "%", "92.0", "±", "2.0", "82.0", "±", "2.8"]
    assert len(lines) == 3  # metrics nobody computed (SPICE, ...) are left out
    single = format_seed_table({0: PER_SEED[0]}).splitlines()
    assert single[1].split() == ["CIDEr", "1.000", "1.200"]  # one seed: no spread shown


def test_a_metric_undefined_for_some_seeds_is_named_and_shows_no_spread_of_one_value():
    per_seed = {0: {"tvmax": _run(1.2, math.nan)}, 1: {"tvmax": _run(1.5, 0.84)}}
    assert format_seed_table(per_seed).splitlines()[2].split() == [
        "object", "recall", "%", "84.0"]
    assert undefined_for_some_seeds(per_seed) == [
        "object_recall of tvmax is undefined for seed(s) 0; its mean and sd are over the "
        "other seeds"]
    assert undefined_for_some_seeds(PER_SEED) == [
        "object_recall of tvmax is undefined for seed(s) 2; its mean and sd are over the "
        "other seeds"]
    # Undefined for every seed: the table leaves the row out, nothing to point out.
    assert undefined_for_some_seeds({0: {"tvmax": _run(1.2, math.nan)}}) == []


def test_figure_is_a_png_with_a_panel_per_computed_metric(tmp_path):
    path = plot_seed_metrics(PER_SEED, tmp_path / "metrics.png", "test split")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > image.height > 100


def test_no_panel_goes_below_zero_where_a_spread_is_wider_than_its_mean():
    # Every metric is non-negative: an error bar of mean - sd < 0 used to drag BLEU-4's axis
    # to -5 and JS's to -0.05.
    per_seed = {0: {"softmax": {"Bleu_4": 0.02, "js_divergence": 0.001}},
                1: {"softmax": {"Bleu_4": 0.30, "js_divergence": 0.090}}}
    figure = seed_metrics_figure(per_seed, "test split")
    panels = [ax for ax in figure.axes if ax.axison]
    assert [ax.get_title() for ax in panels] == ["BLEU-4", "JS consecutive words"]
    assert all(ax.get_ylim()[0] == 0 for ax in panels)
    tops = [ax.get_ylim()[1] for ax in panels]
    assert tops[0] > 30.0 and tops[1] > 0.09  # the best seed's values are shown


def test_the_table_shows_the_non_zero_cells_beside_the_fused_groups():
    # TVmax fuses its non-zero cells into fewer groups of one value; sparsemax cannot.
    per_seed = {0: {"sparsemax": {"fused_groups": 15.8, "support_size": 15.8},
                    "tvmax": {"fused_groups": 10.5, "support_size": 15.0}}}
    lines = format_seed_table(per_seed).splitlines()
    assert lines[1].split() == ["fused", "groups", "per", "word", "15.80", "10.50"]
    assert lines[2].split() == ["non-zero", "cells", "per", "word", "15.8", "15.0"]
