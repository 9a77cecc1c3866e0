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

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from captioner.benchmarks import (
    add_markdown_argument,
    markdown_table,
    refuse_more_threads_than_numba_has,
    refuse_unwritable,
    torch_device,
    use_threads,
    write_markdown,
)
from captioner.commands.options import at_least, command_parser, names, torch_seed
from data_prep.atomic import write_json
from data_prep.paths import check_output_file

PROG = "captioner bench model"
HELP = "time a training step and batched beam search per attention mapping, as ratios"

DEFAULT_MAPPINGS = ("softmax", "sparsemax", "tvmax")
# The row of --tvmax-overlap.
OVERLAP_ROW = "tvmax overlap"
START_ID, END_ID = 1, 2
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
# The phases of train_step, in order: the loss, backward, clipping and the optimizer step, and
# reading the deferred checks back (where the host waits for the device).
STEP_PHASES = ("forward+loss", "backward", "optimizer", "checks")


def _parser() -> argparse.ArgumentParser:
    from captioner.attention.registry import MAPPINGS, mapping_class

    parser = command_parser(PROG, __doc__)
    parser.add_argument(
        "--mappings",
        type=names("mapping", mapping_class),
        default=",".join(DEFAULT_MAPPINGS),
        help="comma-separated output attention mappings (default: %(default)s)",
    )
    parser.add_argument(
        "--input-attention",
        choices=(*MAPPINGS, "same"),
        default="softmax",
        help="input attention mapping of every decoder; same: the output mapping "
        "(default: %(default)s)",
    )
    parser.add_argument("--lam", type=at_least(0, float), default=0.01,
                        help="TVmax lambda (default: %(default)s)")
    parser.add_argument(
        "--tvmax-overlap",
        action="store_true",
        help=f"also time the row {OVERLAP_ROW!r}: TVmax with the output attention solved in a "
        "background thread during the teacher-forced loop (TVMax overlap=True); the row "
        "'tvmax' is then timed without it",
    )
    _sizes(parser)
    parser.add_argument("--repeats", type=at_least(1, int), default=5,
                        help="timed runs per measurement (default: %(default)s)")
    parser.add_argument("--warmup", type=at_least(0, int), default=1,
                        help="untimed rounds first (default: %(default)s)")
    parser.add_argument("--device", type=torch_device, default="cpu",
                        help="torch device: cpu, cuda, cuda:1, ... (default: %(default)s)")
    parser.add_argument("--threads", type=at_least(1, int), default=None,
                        help="torch and numba threads (default: as is)")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: elapsed time; cpu: CPU time of this process (all its threads), steadier "
        "than wall time on a machine shared with other work, CPU devices only "
        "(default: %(default)s)",
    )
    parser.add_argument("--seed", type=torch_seed, default=0,
                        help="seed of the batch and the decoders (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the results here (checked before anything is timed)")
    add_markdown_argument(parser)
    return parser


def _sizes(parser: argparse.ArgumentParser) -> None:
    """The options that size the batch, the model and the beam search, each with its least
    value (the vocabulary holds the 4 special tokens and a word to caption with, a caption its
    start token and a word)."""
    for flag, low, default, what in (
        ("--batch-size", 1, 64, "images per batch"),
        ("--grid", 1, 8, "feature grid side"),
        ("--channels", 1, 2048, "feature channels, such as 2048 (ResNet-50/101/152) or 512 "
         "(ResNet-18/34)"),
        ("--vocab-size", 5, 10000, "words, the 4 special tokens and at least one word"),
        ("--caption-length", 2, 16, "teacher-forced caption length, start token included"),
        ("--beam-size", 1, 3, "beams per image"),
        ("--max-length", 1, 16, "beam search max words"),
    ):
        parser.add_argument(flag, type=at_least(low, int), default=default,
                            help=f"{what} (default: %(default)s)")


def _parse(argv: list[str]) -> argparse.Namespace:
    """The options, each refused on one line (status 2) before anything runs, the ``--json``
    path included: a run must not be lost to its output file after it has been timed."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.clock == "cpu" and args.device.type != "cpu":
        parser.error(f"--clock cpu only measures CPU devices, not --device {args.device}")
    if args.tvmax_overlap and "tvmax" not in args.mappings:
        parser.error("--tvmax-overlap times TVmax a second way: give --mappings with tvmax")
    refuse_unwritable(parser, "--json", args.json, check_output_file)
    refuse_unwritable(parser, "--markdown", args.markdown, check_output_file)
    refuse_more_threads_than_numba_has(parser, args.threads)
    return args


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

    def __init__(self, row: str, args: argparse.Namespace, features, captions):
        import torch

        # With --tvmax-overlap, TVmax's rows are timed with the background solve off and on.
        mapping = "tvmax" if row == OVERLAP_ROW else row
        self.overlap = row == OVERLAP_ROW if args.tvmax_overlap and mapping == "tvmax" else None

        from captioner.model.decoder import AttentionDecoder
        from captioner.training.optimizer import PAPER_BETAS, PAPER_LR, adam

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
    mappings: list[str], args: argparse.Namespace, features, captions, synchronize
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


def main(argv: list[str]) -> int:
    args = _parse(argv)

    import torch

    threads = use_threads(args.threads)
    device = args.device
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    generator = torch.Generator().manual_seed(args.seed)
    features = (
        torch.randn(args.batch_size, args.grid, args.grid, args.channels, generator=generator)
        .half()
        .to(device)
        .float()
    )
    captions = torch.randint(
        4, args.vocab_size, (args.batch_size, args.caption_length), generator=generator
    )
    captions[:, 0] = START_ID
    captions = captions.to(device)

    settings = (
        f"batch {args.batch_size}, grid {args.grid}x{args.grid}x{args.channels}, vocab "
        f"{args.vocab_size}, caption length {args.caption_length}, beam {args.beam_size}, "
        f"max length {args.max_length}, input attention {args.input_attention}, device "
        f"{device}, {threads}; {args.clock} clock, fastest of "
        f"{args.repeats} runs"
    )
    print(settings)
    tvmax_module = importlib.import_module("captioner.attention.tvmax")
    notes = list(NOTES)
    if tvmax_module.SOLVER_OVERRIDE is not None:
        notes.append(f"TVmax solver: {tvmax_module.SOLVER_OVERRIDE} (CAPTIONER_TVMAX_SOLVER "
                     "overrides the model's setting)")
        print(notes[-1])
    rows = [*args.mappings, *([OVERLAP_ROW] if args.tvmax_overlap else [])]
    results = _run_all(rows, args, features, captions, synchronize)
    cells = _cells(results)
    print(_table(cells))
    stats = tvmax_module.DEVICE_STATS
    if stats["grids"]:
        notes.append(f"TVmax device solver: {stats['fallback']} of {stats['grids']} grids left "
                     "to the CPU solver by its certificate")
        print(notes[-1])
    write_markdown(args.markdown, device, f"Settings: {settings}.", _markdown(cells), notes)
    if args.json is not None:
        write_json(args.json, results, indent=2)
    failed = [name for name, row in results.items() if "error" in row]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
