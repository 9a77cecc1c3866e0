"""``captioner bench model``: training-step and beam-search time per output attention mapping.

Every mapping runs on the same random cached-feature batch (float16 features promoted to
float32, as read from a feature cache) and the same random captions, with decoders built from
the same seed, so the rows differ only in the output attention mapping (the input attention is
softmax, as in the TVmax paper, Sec. 3). The mappings take turns, round after round, so that a
change of load on the machine affects them alike; each timing is the fastest of ``--repeats``
runs (timeit's convention: the run least disturbed by other processes; ``--json`` also holds
the medians), and each ratio to softmax comes with the range of the ratios of the runs of one
round, which ran one after the other (how far a single pair of runs could mislead). Two
timings per mapping:

* training step: teacher-forced forward, cross-entropy, backward and an Adam step, with the
  checks of scores and targets read back once after the step, as `captioner fit` does;
* inference: batched beam search over the whole batch (all images x beams in one tensor).

With ``--tvmax-overlap`` TVmax is timed twice, without and with its output attention solved in
a background thread during the teacher-forced loop (TVMax's ``overlap``).

The paper reports inference 1.1x (sparsemax) and 1.3x (TVmax) slower than softmax (Sec. 4).
A mapping that fails while it runs gets its error in its row; the others are still measured.
An unknown mapping, like any other bad option, is refused before anything is timed.
"""

from __future__ import annotations

import importlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from captioner.benchmarks import (
    markdown_table,
    refuse_bad_seed,
    refuse_below,
    refuse_more_threads_than_numba_has,
    refuse_unknown,
    refuse_unwritable,
    torch_device,
    use_threads,
    write_markdown,
)
from data_prep.atomic import write_json
from data_prep.paths import check_output_file
from data_prep.wording import names

HELP = "time a training step and batched beam search per attention mapping, as ratios"

DEFAULT_MAPPINGS = ("softmax", "sparsemax", "tvmax")
# The row of --tvmax-overlap.
OVERLAP_ROW = "tvmax overlap"
START_ID, END_ID = 1, 2
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
# The phases of train_step, in order: the loss, backward, clipping and the optimizer step, and
# reading the deferred checks back (where the host waits for the device).
STEP_PHASES = ("forward+loss", "backward", "optimizer", "checks")


# The options that size the batch, the model and the beam search, with their least values
# (the vocabulary holds the 4 special tokens and a word to caption with, a caption its start
# token and a word).
LEAST = {"batch_size": 1, "grid": 1, "channels": 1, "vocab_size": 5, "caption_length": 2,
         "beam_size": 1, "max_length": 1, "repeats": 1, "warmup": 0, "lam": 0}


def check_options(**options) -> None:
    """ValueError naming the first option of :func:`benchmark` that cannot run, the ``json``
    path included: a run must not be lost to its output file after it has been timed."""
    from captioner.attention.registry import MAPPINGS, mapping_class

    for name, low in LEAST.items():
        refuse_below(name.replace("_", "-"), options[name], low)
    try:
        mappings = names("mapping", mapping_class)(options["mappings"])
    except ValueError as exc:
        raise ValueError(f"argument --mappings: {exc}") from None
    refuse_unknown("input-attention", options["input_attention"], (*MAPPINGS, "same"))
    refuse_unknown("clock", options["clock"], sorted(CLOCKS))
    refuse_bad_seed(options["seed"])
    device = torch_device(options["device"])  # cpu, cuda or cuda:N, present on this machine
    if options["clock"] == "cpu" and device.type != "cpu":
        raise ValueError(f"--clock cpu only measures CPU devices, not --device "
                         f"{options['device']}")
    if options["tvmax_overlap"] and "tvmax" not in mappings:
        raise ValueError("--tvmax-overlap times TVmax a second way: give --mappings with tvmax")
    refuse_unwritable("--json", options["json"], check_output_file)
    refuse_unwritable("--markdown", options["markdown"], check_output_file)
    refuse_more_threads_than_numba_has(options["threads"])


def train_step(model, optimizer, inputs, captions, *, output_mapping: str = "softmax",
               clip_norm: float | None = None, autocast=None,
               mark: Callable[[str], None] | None = None) -> None:
    """One training step as ``captioner fit`` takes it: the teacher-forced loss of
    ``output_mapping`` (under ``autocast``, a context manager, when given) with its input
    checks deferred, backward, the gradient norm clipped to ``clip_norm`` when given, an
    optimizer step, and then the checks read back (the step's one host sync). ``mark``, when
    given, is called with each of :data:`STEP_PHASES` as that phase ends."""
    import contextlib

    import torch

    from captioner.attention import DeferredChecks
    from captioner.model.losses import teacher_forced_loss

    mark = mark or (lambda phase: None)
    with DeferredChecks() as checks, autocast or contextlib.nullcontext():
        loss = teacher_forced_loss(model, inputs, captions, output_mapping=output_mapping)
    mark("forward+loss")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    mark("backward")
    if clip_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    mark("optimizer")
    checks.raise_first()
    mark("checks")


class _Runner:
    """One row: a decoder (output attention ``row``, or TVmax for :data:`OVERLAP_ROW`) with its
    optimizer and the two timed jobs."""

    def __init__(self, row: str, args: SimpleNamespace, features, captions):
        import torch

        # With --tvmax-overlap, TVmax's rows are timed with the background solve off and on.
        mapping = "tvmax" if row == OVERLAP_ROW else row
        self.overlap = row == OVERLAP_ROW if args.tvmax_overlap and mapping == "tvmax" else None

        from captioner.model.decoder import AttentionDecoder
        from captioner.model.hyperparameters import PAPER_BETAS, PAPER_LR
        from captioner.training.optimizer import adam

        input_attention = mapping if args.input_attention == "same" else args.input_attention
        torch.manual_seed(args.seed)
        self.decoder = AttentionDecoder(
            args.vocab_size,
            args.channels,
            input_attention=input_attention,
            input_attention_kwargs={"lam": args.lam} if input_attention == "tvmax" else {},
            output_attention=mapping,
            output_attention_kwargs={"lam": args.lam} if mapping == "tvmax" else {},
        ).to(features.device)
        self.optimizer = adam(self.decoder.parameters(), lr=PAPER_LR, betas=PAPER_BETAS)
        self.args, self.features, self.captions = args, features, captions
        self.times: dict[str, list[float]] = {"train_step_ms": [], "beam_search_ms": []}
        self.lengths: list[int] = []
        # Host seconds of each call of the output attention's mapping in the timed beam
        # searches (once a word), from hooks around its forward pass.
        self.mapping_seconds: list[float] = []
        self._searching = False
        mapping = self.decoder.output_attention.mapping
        mapping.register_forward_pre_hook(self._mapping_starts)
        mapping.register_forward_hook(self._mapping_ends)

    def _mapping_starts(self, module, inputs) -> None:
        self._called_at = time.perf_counter()

    def _mapping_ends(self, module, inputs, output) -> None:
        if self._searching:
            self.mapping_seconds.append(time.perf_counter() - self._called_at)

    def train_step(self) -> None:
        self.decoder.train()
        train_step(self.decoder, self.optimizer, self.features, self.captions)

    def beam_search(self) -> None:
        from captioner.model.decoding import beam_search

        self.decoder.eval()
        self._searching = True
        try:
            hypotheses = beam_search(
                self.decoder,
                self.features,
                start_id=START_ID,
                end_id=END_ID,
                beam_size=self.args.beam_size,
                max_length=self.args.max_length,
            )
        finally:
            self._searching = False
        self.lengths = [len(h.token_ids) for h in hypotheses]

    def timed(self, job: str, synchronize: Callable[[], None]) -> None:
        import contextlib

        from captioner.attention.tvmax import overlap_set_to

        run = self.train_step if job == "train_step_ms" else self.beam_search
        clock = CLOCKS[self.args.clock]
        with contextlib.nullcontext() if self.overlap is None else overlap_set_to(self.overlap):
            synchronize()
            start = clock()
            run()
            synchronize()
        self.times[job].append((clock() - start) * 1000.0)

    def summary(self) -> dict:
        row = {job: min(times) for job, times in self.times.items()}
        row.update({f"{job}_median": statistics.median(t) for job, t in self.times.items()})
        row["mean_caption_length"] = sum(self.lengths) / len(self.lengths)
        row["output_mapping_us"] = statistics.median(self.mapping_seconds) * 1e6
        return row


def _run_all(
    mappings: list[str], args: SimpleNamespace, features, captions, synchronize
) -> dict[str, dict]:
    """Warm up, then time the mappings in turn, round after round, so that a change of load
    on the machine affects all of them alike."""
    from tqdm import tqdm

    errors: dict[str, str] = {}
    runners: dict[str, _Runner] = {}
    rounds = args.warmup + args.repeats
    with tqdm(total=rounds * len(mappings), desc="bench model", unit="run", file=sys.stderr) as bar:
        for mapping in mappings:
            try:
                runners[mapping] = _Runner(mapping, args, features, captions)
            except Exception as exc:  # a missing or broken mapping must not hide the others
                errors[mapping] = f"{type(exc).__name__}: {exc}"
                bar.update(rounds)
        for round_index in range(rounds):
            for mapping, runner in list(runners.items()):
                try:
                    for job in runner.times:
                        runner.timed(job, synchronize)
                except Exception as exc:
                    errors[mapping] = f"{type(exc).__name__}: {exc}"
                    del runners[mapping]
                    bar.update(rounds - round_index - 1)
                if round_index < args.warmup and mapping in runners:
                    for times in runner.times.values():
                        times.clear()
                    runner.mapping_seconds.clear()
                bar.update(1)
    results = {
        mapping: {"error": errors[mapping]} if mapping in errors else runners[mapping].summary()
        for mapping in mappings
    }
    if "softmax" in runners:
        base = runners["softmax"].times
        for mapping, runner in runners.items():
            for job, times in runner.times.items():
                ratios = [taken / base_taken for taken, base_taken in zip(times, base[job],
                                                                          strict=True)]
                results[mapping][f"{job}_round_ratios"] = [min(ratios), max(ratios)]
    return results


COLUMNS = ("mapping", "train step ms", "x softmax", "rounds", "beam search ms", "x softmax",
           "rounds", "words", "mapping us")
# The text table's column widths (the mapping's left-aligned, the figures right-aligned).
WIDTHS = (14, 15, 11, 12, 16, 11, 12, 7, 12)
NOTES = (
    "rounds: the least and the greatest ratio to softmax of the runs of one round, which ran "
    "one after the other",
    "mapping us: host time of one call of the output attention's mapping in beam search (a "
    "word's; its syncs and copies included), median",
)


def _cells(results: dict[str, dict]) -> list[list[str]]:
    """The rows of the table as strings (see :data:`COLUMNS`); a failed mapping's row holds
    its error in the second cell."""
    base = results.get("softmax", {})
    rows = []
    for mapping, row in results.items():
        if "error" in row:
            rows.append([mapping, f"error: {row['error']}"])
            continue
        ratios = [
            f"{row[key] / base[key]:.2f}x" if key in base else "n/a"
            for key in ("train_step_ms", "beam_search_ms")
        ]
        rounds = [
            "{:.2f}-{:.2f}".format(*row[f"{key}_round_ratios"])
            if f"{key}_round_ratios" in row else "n/a"
            for key in ("train_step_ms", "beam_search_ms")
        ]
        rows.append([mapping, f"{row['train_step_ms']:.1f}", ratios[0], rounds[0],
                     f"{row['beam_search_ms']:.1f}", ratios[1], rounds[1],
                     f"{row['mean_caption_length']:.1f}", f"{row['output_mapping_us']:.0f}"])
    return rows


def _table(rows: list[list[str]]) -> str:
    def line(cells) -> str:
        return "".join(f"{cell:<{width}}" if i == 0 else f"{cell:>{width}}"
                       for i, (cell, width) in enumerate(zip(cells, WIDTHS, strict=False)))

    header = line(COLUMNS)
    lines = [header, "-" * len(header)]
    lines += [f"{row[0]:<{WIDTHS[0]}}{row[1]}" if len(row) == 2 else line(row) for row in rows]
    return "\n".join([*lines, *NOTES])


def _markdown(rows: list[list[str]]) -> str:
    padded = [row if len(row) == len(COLUMNS) else [*row, *[""] * (len(COLUMNS) - len(row))]
              for row in rows]
    return markdown_table(COLUMNS, padded)


def benchmark(mappings: str = ",".join(DEFAULT_MAPPINGS), input_attention: str = "softmax",
              lam: float = 0.01, tvmax_overlap: bool = False, batch_size: int = 64,
              grid: int = 8, channels: int = 2048, vocab_size: int = 10000,
              caption_length: int = 16, beam_size: int = 3, max_length: int = 16,
              repeats: int = 5, warmup: int = 1, device: str = "cpu", threads: int | None = None,
              clock: str = "wall", seed: int = 0, json: Path | None = None,
              markdown: Path | None = None) -> int:
    """Time a training step and a batched beam search of a decoder per output attention
    mapping and print the table of their times and ratios to softmax; the exit status: 0, or
    1 when a mapping failed (its error in its row).

    Args:
        mappings: comma-separated output attention mappings.
        input_attention: input attention mapping of every decoder; same: the output mapping.
        lam: TVmax lambda.
        tvmax_overlap: also time the row 'tvmax overlap': TVmax with the output attention
            solved in a background thread during the teacher-forced loop (TVMax
            overlap=True); the row 'tvmax' is then timed without it.
        batch_size: images per batch.
        grid: feature grid side.
        channels: feature channels, such as 2048 (ResNet-50/101/152) or 512 (ResNet-18/34).
        vocab_size: words, the 4 special tokens and at least one word.
        caption_length: teacher-forced caption length, start token included.
        beam_size: beams per image.
        max_length: beam search max words.
        repeats: timed runs per measurement.
        warmup: untimed rounds first.
        device: torch device: cpu, cuda, cuda:1, ...
        threads: torch and numba threads (null: as they are).
        clock: wall: elapsed time; cpu: CPU time of this process (all its threads), steadier
            than wall time on a machine shared with other work, CPU devices only.
        seed: seed of the batch and the decoders.
        json: also write the results to this file (checked before anything is timed).
        markdown: also write the table as markdown to this file, under a line naming the
            machine, the library versions and the date (checked before anything is timed).
    """
    # The options by name, as the runners read them, the device resolved.
    args = SimpleNamespace(**{**locals(), "device": torch_device(device)})
    threads_line = use_threads(threads)
    features, captions = _batch(args)
    settings = (
        f"batch {batch_size}, grid {grid}x{grid}x{channels}, vocab {vocab_size}, caption "
        f"length {caption_length}, beam {beam_size}, max length {max_length}, input attention "
        f"{input_attention}, device {args.device}, {threads_line}; {clock} clock, fastest of "
        f"{repeats} runs"
    )
    print(settings)
    return _report(args, features, captions, settings)


def _batch(args: SimpleNamespace) -> tuple:
    """The random batch every mapping runs on: features (B, grid, grid, channels), float16
    promoted to float32 as read from a feature cache, and captions (B, caption_length),
    int64, each starting with the start token, on the benchmark's device."""
    import torch

    generator = torch.Generator().manual_seed(args.seed)
    features = (
        torch.randn(args.batch_size, args.grid, args.grid, args.channels, generator=generator)
        .half()
        .to(args.device)
        .float()
    )
    captions = torch.randint(
        4, args.vocab_size, (args.batch_size, args.caption_length), generator=generator
    )
    captions[:, 0] = START_ID
    return features, captions.to(args.device)


def _report(args: SimpleNamespace, features, captions, settings: str) -> int:
    """Time every mapping, print the table and its notes, write the markdown and JSON files
    asked for; the exit status: 1 when a mapping failed, else 0."""
    import torch

    synchronize = torch.cuda.synchronize if args.device.type == "cuda" else (lambda: None)
    tvmax_module = importlib.import_module("captioner.attention.tvmax")
    notes = list(NOTES)
    if tvmax_module.SOLVER_OVERRIDE is not None:
        notes.append(f"TVmax solver: {tvmax_module.SOLVER_OVERRIDE} (CAPTIONER_TVMAX_SOLVER "
                     "overrides the model's setting)")
        print(notes[-1])
    rows = [*names("mapping")(args.mappings), *([OVERLAP_ROW] if args.tvmax_overlap else [])]
    results = _run_all(rows, args, features, captions, synchronize)
    cells = _cells(results)
    print(_table(cells))
    stats = tvmax_module.DEVICE_STATS
    if stats["grids"]:
        notes.append(f"TVmax device solver: {stats['fallback']} of {stats['grids']} grids left "
                     "to the CPU solver by its certificate")
        print(notes[-1])
    write_markdown(args.markdown, args.device, f"Settings: {settings}.", _markdown(cells), notes)
    if args.json is not None:
        write_json(args.json, results, indent=2)
    failed = [name for name, row in results.items() if "error" in row]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
