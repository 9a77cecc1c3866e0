"""The paper's Table 1 layout: SPICE, CIDEr, ROUGE_L, BLEU-4, METEOR, REP.

SPICE, ROUGE_L, BLEU-4 and METEOR are shown x100, CIDEr raw, REP as defined (already x100),
as in the paper (e.g. softmax on MSCOCO: 18.4 0.967 52.9 29.9 24.9 3.76)."""

from __future__ import annotations

import math
from collections.abc import Mapping

# (column title, metric key, scale, decimals)
TABLE1_COLUMNS: tuple[tuple[str, str, float, int], ...] = (
    ("SPICE", "SPICE", 100.0, 1),
    ("CIDEr", "CIDEr", 1.0, 3),
    ("ROUGE_L", "ROUGE_L", 100.0, 1),
    ("BLEU4", "Bleu_4", 100.0, 1),
    ("METEOR", "METEOR", 100.0, 1),
    ("REP", "REP", 1.0, 2),
)


def format_table1(rows: Mapping[str, Mapping[str, float]]) -> str:
    """One line per model: ``rows[model][metric key]`` (raw pycocoevalcap values and REP);
    metrics not computed show as '-'."""
    name_width = max(8, *(len(name) for name in rows))
    # A space before every cell, so that a value wider than its column (a REP of 300065.00)
    # still stands apart from its neighbour.
    header = f"{'':<{name_width}}" + "".join(f" {title:>8}" for title, *_ in TABLE1_COLUMNS)
    lines = [header]
    for name, metrics in rows.items():
        cells = []
        for _, key, scale, decimals in TABLE1_COLUMNS:
            value = metrics.get(key)
            text = ("-" if value is None else "nan" if math.isnan(value)
                    else f"{value * scale:.{decimals}f}")
            cells.append(f" {text:>8}")
        lines.append(f"{name:<{name_width}}" + "".join(cells))
    return "\n".join(lines)


# The demo's comparison (``captioner demo``): Table 1's metrics, then object recall and the
# attention statistics. (row title, metric key, scale, decimals)
SEED_TABLE_ROWS: tuple[tuple[str, str, float, int], ...] = (
    ("CIDEr", "CIDEr", 1.0, 3),
    ("SPICE", "SPICE", 100.0, 1),
    ("BLEU-4", "Bleu_4", 100.0, 1),
    ("METEOR", "METEOR", 100.0, 1),
    ("ROUGE-L", "ROUGE_L", 100.0, 1),
    ("REP", "REP", 1.0, 2),
    ("object recall %", "object_recall", 100.0, 1),
    ("zero attention %", "zero_attention", 100.0, 1),
    ("JS consecutive words", "js_divergence", 1.0, 3),
    ("fused groups per word", "fused_groups", 1.0, 2),
    ("non-zero cells per word", "support_size", 1.0, 1),
    ("attention precision %, shape word", "attention_precision", 100.0, 1),
    ("attention precision %, whole phrase", "attention_precision_phrase", 100.0, 1),
)


def mean_and_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1) of the finite ``values``: the sd is nan
    (undefined, ``null`` in JSON) for a single value, and both are nan when none is
    finite."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return math.nan, math.nan
    mean = sum(finite) / len(finite)
    if len(finite) == 1:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))


def undefined_for_some_seeds(per_seed: Mapping[int, Mapping[str, Mapping[str, float]]]
                             ) -> list[str]:
    """One line per (mapping, metric) that is nan for some seeds but not all, naming them:
    its mean and sd are over the other seeds only, which a reader of the table must know."""
    mappings = next(iter(per_seed.values()))
    keys = sorted({k for by_mapping in per_seed.values() for m in by_mapping.values() for k in m})
    lines = []
    for mapping in mappings:
        for key in keys:
            undefined = [s for s in per_seed if math.isnan(per_seed[s][mapping].get(key, math.nan))]
            if undefined and len(undefined) < len(per_seed):
                lines.append(f"{key} of {mapping} is undefined for seed(s) "
                             f"{', '.join(map(str, undefined))}; its mean and sd are over the "
                             "other seeds")
    return lines


def per_mapping_values(per_seed: Mapping[int, Mapping[str, Mapping[str, float]]],
                       key: str) -> dict[str, list[float]]:
    """``per_seed[seed][mapping][key]`` gathered as {mapping: [value of each seed]} (nan where
    a seed lacks the metric)."""
    mappings = next(iter(per_seed.values()))
    return {m: [per_seed[s][m].get(key, math.nan) for s in per_seed] for m in mappings}


def computed_rows(per_seed: Mapping[int, Mapping[str, Mapping[str, float]]]):
    """The rows of :data:`SEED_TABLE_ROWS` that ``per_seed`` has a value of, each with its
    :func:`per_mapping_values`: [((title, key, scale, decimals), {mapping: [values]})]."""
    rows = [(row, per_mapping_values(per_seed, row[1])) for row in SEED_TABLE_ROWS]
    return [(row, values) for row, values in rows
            if not all(math.isnan(v) for vs in values.values() for v in vs)]


def format_seed_table(per_seed: Mapping[int, Mapping[str, Mapping[str, float]]]) -> str:
    """One row per metric of :data:`SEED_TABLE_ROWS`, one column per mapping: the mean over
    the seeds ``± sd`` (the sd only with several seeds); metrics not computed are left out."""
    mappings = list(next(iter(per_seed.values())))
    several = len(per_seed) > 1
    width = 16 if several else 10
    title_width = max(len(title) for title, *_ in SEED_TABLE_ROWS)
    lines = [f"{'':<{title_width}}" + "".join(f"{m:>{width}}" for m in mappings)]
    for (title, _, scale, decimals), values in computed_rows(per_seed):
        cells = []
        for mapping in mappings:
            mean, sd = mean_and_sd(values[mapping])
            cell = f"{mean * scale:.{decimals}f}"
            cells.append(f"{cell} ± {sd * scale:.{decimals}f}" if several and not math.isnan(sd)
                         else cell)
        lines.append(f"{title:<{title_width}}" + "".join(f"{c:>{width}}" for c in cells))
    return "\n".join(lines)
