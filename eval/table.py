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
    header = f"{'':<{name_width}}" + "".join(f"{title:>9}" for title, *_ in TABLE1_COLUMNS)
    lines = [header]
    for name, metrics in rows.items():
        cells = []
        for _, key, scale, decimals in TABLE1_COLUMNS:
            value = metrics.get(key)
            if value is None:
                cells.append(f"{'-':>9}")
            elif math.isnan(value):
                cells.append(f"{'nan':>9}")
            else:
                cells.append(f"{value * scale:>9.{decimals}f}")
        lines.append(f"{name:<{name_width}}" + "".join(cells))
    return "\n".join(lines)
