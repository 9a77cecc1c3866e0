"""``captioner bench`` lists its benchmarks; ``bench model`` runs end to end on tiny sizes and
reports a failing mapping's error; ``bench attention`` prints its ratios for either kind of
scores."""

from __future__ import annotations

import importlib
import json
import time

import pytest

from captioner.benchmarks import model as bench
from captioner.commands import bench as command

TINY = [
    "--batch-size", "2", "--grid", "3", "--channels", "8", "--vocab-size", "20",
    "--caption-length", "4", "--beam-size", "2", "--max-length", "3", "--repeats", "1",
    "--warmup", "0", "--threads", "1",
]  # fmt: skip


def test_bench_model_prints_ratios_to_softmax(capsys, tmp_path):
    out = tmp_path / "bench.json"
    assert command.main(["model", *TINY, "--mappings", "softmax,sparsemax",
                         "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "train step ms" in printed and "beam search ms" in printed
    # TVmax, fusedmax and oscarmax solve on numba's threads: --threads sets them too.
    assert "threads torch=1 numba=1;" in printed.splitlines()[0]
    rows = {line.split()[0]: line.split() for line in printed.splitlines()[3:]}
    assert rows["softmax"][2] == "1.00x" and rows["softmax"][5] == "1.00x"
    results = json.loads(out.read_text())
    assert set(results) == {"softmax", "sparsemax"}
    assert all(row["train_step_ms"] > 0 and row["beam_search_ms"] > 0 for row in results.values())


def test_bench_model_gives_each_ratio_with_the_range_of_its_rounds(capsys, monkeypatch,
                                                                   tmp_path):
    # Sparsemax's beam searches take 0, 150 and 50 ms longer than they would: the ratios of
    # the three rounds spread, and the ratio of the fastest runs lies within their range.
    search, delays = bench._Runner.beam_search, iter([0.0, 0.150, 0.050])

    def slower(self):
        search(self)
        if self.decoder.output_attention_name == "sparsemax":
            time.sleep(next(delays))

    monkeypatch.setattr(bench._Runner, "beam_search", slower)
    out = tmp_path / "bench.json"
    options = [*TINY, "--mappings", "softmax,sparsemax", "--input-attention", "softmax",
               "--repeats", "3", "--json", str(out)]
    assert command.main(["model", *options]) == 0
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    low, high = results["sparsemax"]["beam_search_ms_round_ratios"]
    ratio = results["sparsemax"]["beam_search_ms"] / results["softmax"]["beam_search_ms"]
    assert low <= ratio <= high and high - low > 0.2
    assert results["softmax"]["train_step_ms_round_ratios"] == [1.0, 1.0]
    rows = {line.split()[0]: line.split() for line in printed.splitlines()[3:5]}
    assert rows["softmax"][3] == "1.00-1.00" and rows["sparsemax"][6] == f"{low:.2f}-{high:.2f}"
    assert "rounds: the least and the greatest ratio to softmax" in printed


def test_bench_model_times_each_call_of_the_output_mapping_in_beam_search(capsys, monkeypatch,
                                                                         tmp_path):
    from captioner.attention import Sparsemax

    forward = Sparsemax.forward

    def slow(self, *args, **kwargs):
        time.sleep(0.004)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(Sparsemax, "forward", slow)
    out = tmp_path / "bench.json"
    assert command.main(["model", *TINY, "--mappings", "softmax,sparsemax",
                         "--input-attention", "softmax", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "mapping us: host time of one call of the output attention's mapping" in printed
    results = json.loads(out.read_text())
    assert results["sparsemax"]["output_mapping_us"] >= 4000
    assert results["softmax"]["output_mapping_us"] < 4000
    rows = {line.split()[0]: line.split() for line in printed.splitlines()[3:5]}
    assert float(rows["sparsemax"][8]) == round(results["sparsemax"]["output_mapping_us"])


def test_bench_model_reports_a_failing_mapping_and_measures_the_rest(capsys, monkeypatch):
    from captioner.attention import Sparsemax

    def broken(self, *args, **kwargs):
        raise RuntimeError("broken mapping")

    monkeypatch.setattr(Sparsemax, "forward", broken)
    assert command.main(["model", *TINY, "--mappings", "softmax,sparsemax", "--clock", "cpu"]) == 1
    captured = capsys.readouterr()
    failed = [line for line in captured.out.splitlines() if " error: " in line]
    assert failed == ["sparsemax     error: RuntimeError: broken mapping"]
    assert "softmax" in captured.out.splitlines()[3]
    assert captured.err.endswith("failed: sparsemax\n")


def test_bench_model_times_tvmax_with_and_without_the_background_solve(capsys, monkeypatch):
    import threading

    tvmax = importlib.import_module("captioner.attention.tvmax")
    solved_in = []
    kernel = tvmax._tvmax_rows
    monkeypatch.setattr(tvmax, "_tvmax_rows",
                        lambda *args: solved_in.append(threading.get_ident()) or kernel(*args))
    monkeypatch.setattr(tvmax, "OVERLAP_OVERRIDE", None)
    options = [*TINY, "--mappings", "softmax,tvmax", "--tvmax-overlap", "--input-attention",
               "softmax"]
    assert command.main(["model", *options]) == 0
    rows = [line.split("  ")[0] for line in capsys.readouterr().out.splitlines()[3:6]]
    assert rows == ["softmax", "tvmax", "tvmax overlap"]
    # One training step per row, its 3 words one solve; beam search solves word by word, in
    # the caller's thread: so the overlap row's training step alone solved in the background.
    elsewhere = [thread != threading.get_ident() for thread in solved_in]
    assert sum(elsewhere) == 1 and not elsewhere[0]
    assert tvmax.OVERLAP_OVERRIDE is None


def test_bench_help_names_every_benchmark(capsys):
    assert command.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, target in command._TARGETS.items():
        assert f"  {name} " in out and importlib.import_module(target).HELP in out
    assert command.main(["nope"]) == 2
    assert capsys.readouterr().err == (
        "captioner bench: unknown benchmark 'nope'; expected one of attention, model, fit, page\n")
    assert command.main([]) == 2
    assert capsys.readouterr().err.startswith("usage: captioner bench")


def test_bench_attention_prints_ratios_on_smooth_scores(capsys):
    assert command.main(["attention", "--repeats", "1", "--threads", "1",
                         "--scores", "smooth"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    # Progress goes to stderr, so that a redirected table holds the table only.
    assert "done" not in printed and "done 64x8x8\n" in captured.err
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


def _tiny_decoder():
    import torch

    from captioner.model.decoder import AttentionDecoder

    torch.manual_seed(0)
    decoder = AttentionDecoder(20, 8, feature_dim=8, embed_dim=8, hidden_dim=8, attention_dim=8)
    features = torch.randn(2, 3, 3, 8)
    captions = torch.tensor([[1, 5, 6, 2], [1, 7, 2, 0]])
    return decoder, features, captions


def test_benchmark_train_step_defers_its_checks_like_fit(monkeypatch):
    """The timed step collects the attention and loss checks as ``captioner fit`` does, so
    that on a GPU it syncs once per step, not once per attention call."""
    import torch

    from captioner.attention import _checks

    decoder, features, captions = _tiny_decoder()
    collecting = []
    decoder.register_forward_pre_hook(lambda *_: collecting.append(_checks._COLLECTOR.get()))
    optimizer = torch.optim.SGD(decoder.parameters(), lr=0.1)
    bench.train_step(decoder, optimizer, features, captions)
    assert len(collecting) == 1 and collecting[0] is not None
    assert _checks._COLLECTOR.get() is None
    bad = captions.clone()
    bad[0, 3] = 99  # a target outside the 20-word vocabulary, never an input
    try:
        bench.train_step(decoder, optimizer, features, bad)
    except ValueError as error:
        assert "target ids must lie in [0, 20)" in str(error)
    else:
        raise AssertionError("a target outside the vocabulary was not reported")


def test_benchmark_train_step_clips_the_gradient_norm():
    import torch

    decoder, features, captions = _tiny_decoder()
    before = torch.cat([p.detach().flatten().clone() for p in decoder.parameters()])
    optimizer = torch.optim.SGD(decoder.parameters(), lr=1.0)
    bench.train_step(decoder, optimizer, features, captions, clip_norm=1e-3)
    after = torch.cat([p.detach().flatten() for p in decoder.parameters()])
    # SGD with lr 1 moves the parameters by exactly the clipped gradient.
    assert torch.linalg.vector_norm(after - before) == pytest.approx(1e-3, rel=1e-3)


def test_bench_attention_times_calls_with_their_checks_deferred():
    """As in the model: on a GPU a timed call must not sync for its input check."""
    import torch

    from captioner.attention import _checks, softmax
    from captioner.benchmarks import attention

    collecting = []

    def recording(z):
        collecting.append(_checks._COLLECTOR.get())
        return softmax(z)

    z = torch.randn(4, 9, requires_grad=True)
    one_round = attention._timer(recording, z, torch.randn(4, 9), time.perf_counter, lambda: None)
    assert one_round() > 0
    assert collecting and all(collector is not None for collector in collecting)
    assert _checks._COLLECTOR.get() is None
