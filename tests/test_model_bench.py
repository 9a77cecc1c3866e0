"""``captioner bench`` lists its benchmarks; ``bench model`` runs end to end on tiny sizes and
reports a failing mapping's error; ``bench attention`` prints its ratios for either kind of
scores."""

from __future__ import annotations

import importlib
import json

from captioner.benchmarks import model as bench

TINY = [
    "--batch-size", "2", "--grid", "3", "--channels", "8", "--vocab-size", "20",
    "--caption-length", "4", "--beam-size", "2", "--max-length", "3", "--repeats", "1",
    "--warmup", "0", "--threads", "1",
]  # fmt: skip


def test_bench_model_prints_ratios_to_softmax(capsys, tmp_path):
    out = tmp_path / "bench.json"
    assert bench.main([*TINY, "--mappings", "softmax,sparsemax", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "train step ms" in printed and "beam search ms" in printed
    rows = {line.split()[0]: line.split() for line in printed.splitlines()[3:]}
    assert rows["softmax"][2] == "1.00x" and rows["softmax"][4] == "1.00x"
    results = json.loads(out.read_text())
    assert set(results) == {"softmax", "sparsemax"}
    assert all(row["train_step_ms"] > 0 and row["beam_search_ms"] > 0 for row in results.values())


def test_bench_model_reports_a_failing_mapping_and_measures_the_rest(capsys):
    assert bench.main([*TINY, "--mappings", "softmax,nope", "--clock", "cpu"]) == 1
    printed = capsys.readouterr().out
    failed = [line for line in printed.splitlines() if line.startswith("nope        error: ")]
    assert len(failed) == 1 and "ValueError" in failed[0]
    assert "unknown attention mapping 'nope'" in failed[0]
    assert "softmax" in printed.splitlines()[3]


def test_bench_help_names_every_benchmark(capsys):
    from captioner.commands import bench as command

    assert command.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, target in command._TARGETS.items():
        assert f"  {name} " in out and importlib.import_module(target).HELP in out
    assert command.main(["nope"]) == 2
    assert capsys.readouterr().err.startswith("usage: captioner bench")


def test_bench_attention_prints_ratios_on_smooth_scores(capsys):
    from captioner.benchmarks import attention

    assert attention.main(["--repeats", "1", "--threads", "1", "--scores", "smooth"]) == 0
    printed = capsys.readouterr().out
    assert "scores smooth N(0, 1)" in printed
    rows = [line.split() for line in printed.splitlines() if line.startswith("64x14x14 ")]
    # Columns: shape, mapping (may hold spaces), us/call, /softmax, /sparsemax, /entmax's.
    ratios = {" ".join(row[1:-4]): row[-2] for row in rows}
    assert ratios["sparsemax"] == "1.00" and float(ratios["tvmax lam=0.1"]) > 0


def test_smooth_scores_have_sd_1_and_alike_neighbours():
    import torch

    from captioner.benchmarks.attention import _scores

    torch.manual_seed(0)
    normal, smooth = (_scores(kind, (256, 14, 14), "cpu") for kind in ("normal", "smooth"))
    assert abs(float(smooth.std()) - 1) < 1e-4

    def neighbour_correlation(z):
        return float(torch.corrcoef(torch.stack([z[:, :, :-1].flatten(),
                                                 z[:, :, 1:].flatten()]))[0, 1])

    assert neighbour_correlation(smooth) > 0.5 > 0.05 > abs(neighbour_correlation(normal))
