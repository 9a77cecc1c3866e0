"""``captioner bench attention``: time forward+backward of the attention mappings side by side.

Scores of shape (batch, H, W), float32, on the CPU or a GPU (``--device cuda``): N(0, 1) per
cell, or with ``--scores smooth`` N(0, 1) noise averaged over each cell's 3 x 3 neighbourhood
and rescaled to sd 1, so that neighbouring cells are alike as in a trained model's scores
(larger fused groups, and more cells within reach of the sparsemax support for TVmax's
screening to keep). Each
timed call is one forward pass and one backward pass of a random upstream gradient. On a GPU,
TVmax runs with both forward solvers (its ``solver`` setting): "device", certified Dykstra
on the GPU (the share of grids its certificate left to the CPU solver is printed), and "host",
the exact CPU solver with a round trip; the backward pass runs on the GPU in both. 1-D mappings
run over the H*W cells of each grid (row-major); TVmax runs on the grid. As in the model, the
checks of the scores are read back once per round, not at every call. Warm-up calls (numba
and Triton compilation included) are not timed. The mappings are timed in interleaved rounds
and each reports its median over rounds, so that load from other processes hits all of them
alike and the ratios stay comparable.

Every call of a shape reuses the same scores. The TVmax kernel branches on the data, and at batch
64 the CPU's branch predictors partly learn the repeated input; at batch 1024 they cannot, so
that row is closer to TVmax's cost on fresh scores (as in training).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

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
from data_prep.paths import check_output_file

HELP = "time forward+backward of softmax, sparsemax, entmax15 and TVmax (ratios printed)"

SHAPES = {
    "cpu": ((64, 8, 8), (1024, 8, 8), (64, 14, 14), (1024, 14, 14)),
    "cuda": ((64, 8, 8), (256, 8, 8), (64, 16, 16), (256, 16, 16)),
}
TVMAX_LAMS = (0.01, 0.1)
SCORES = {"normal": "N(0, 1)", "smooth": "smooth N(0, 1), 3 x 3 mean rescaled to sd 1"}
ROUND_SECONDS = 0.02  # each round repeats a call until it has run at least this long


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def check_options(*, repeats: int, threads: int | None, seed: int, scores: str, device: str,
                  clock: str, markdown: Path | None) -> None:
    """ValueError naming the first option of :func:`benchmark` that cannot run."""
    refuse_below("repeats", repeats, 1)
    refuse_bad_seed(seed)
    refuse_unknown("scores", scores, sorted(SCORES))
    refuse_unknown("clock", clock, sorted(CLOCKS))
    if torch_device(device).type == "cuda" and clock == "cpu":
        raise ValueError(f"--clock cpu only measures CPU devices, not --device {device}")
    refuse_more_threads_than_numba_has(threads)
    refuse_unwritable("--markdown", markdown, check_output_file)


def _mappings(device: str) -> tuple[dict[str, Callable], dict[str, list[int]]]:
    """name -> f(scores (B, H, W)) -> weights (B, H, W), and the device solver's counts of
    (grids, grids left to the CPU) per TVmax mapping."""
    from captioner import attention
    from captioner.benchmarks import counting_device_solver

    def flat(fn):
        return lambda z: fn(z.flatten(-2), dim=-1).unflatten(-1, z.shape[-2:])

    mappings = {
        "softmax": flat(attention.softmax),
        "sparsemax": flat(attention.sparsemax),
    }
    try:
        import entmax
    except ImportError:
        pass
    else:
        mappings["entmax.sparsemax (pkg)"] = flat(entmax.sparsemax)
    mappings["entmax15"] = flat(attention.entmax15)
    fallbacks: dict[str, list[int]] = {}

    def counted(name: str, lam: float) -> Callable:
        def run(z):
            out, grids, fallback = counting_device_solver(
                lambda: attention.tvmax(z, lam, solver="device"))
            fallbacks[name][0] += grids
            fallbacks[name][1] += fallback
            return out
        fallbacks[name] = [0, 0]
        return run

    for lam in TVMAX_LAMS:
        if device == "cuda":
            name = f"tvmax lam={lam:g} (device)"
            mappings[name] = counted(name, lam)
            mappings[f"tvmax lam={lam:g} (host)"] = (
                lambda z, lam=lam: attention.tvmax(z, lam, solver="host"))
        else:
            mappings[f"tvmax lam={lam:g}"] = lambda z, lam=lam: attention.tvmax(z, lam)
    return mappings, fallbacks


def _timer(fn: Callable, z, grad, clock: Callable[[], float],
           synchronize: Callable[[], None]) -> Callable[[], float]:
    """A round: seconds per forward+backward call, over as many calls as fill a round (on a
    GPU: as many as the warm-up calls say fill it, timed between two syncs). The mappings'
    checks of their scores are deferred as in the model (``DeferredChecks``) and read after
    the clock stops, so that a call syncs only where the mapping itself needs the host."""
    from captioner.attention import DeferredChecks

    def seconds(calls: int) -> float:
        with DeferredChecks() as checks:
            synchronize()
            start = clock()
            for _ in range(calls):
                z.grad = None
                fn(z).backward(grad)
            synchronize()
            elapsed = clock() - start
        checks.raise_first()
        return elapsed

    seconds(3)
    calls = max(1, int(ROUND_SECONDS / max(seconds(1), 1e-9)))
    return lambda: seconds(calls) / calls


def _scores(kind: str, shape: tuple[int, int, int], device: str):
    """Float32 scores of the given shape and kind (see SCORES), from torch's global generator."""
    import torch

    z = torch.randn(shape, device=device)
    if kind == "smooth":
        z = torch.nn.functional.avg_pool2d(z[:, None], 3, stride=1, padding=1,
                                           count_include_pad=False)[:, 0]
        z = (z - z.mean()) / z.std()
    return z


def _cells(rows: list[tuple[str, str, float]], baselines: list[str]) -> tuple[list, list]:
    """The header and the rows of the table, as strings: shape, mapping, microseconds per
    call and the ratio to each of ``baselines`` at the same shape."""
    header = ["shape", "mapping", "us/call"] + [f"/{b}" for b in baselines]
    lines = []
    for shape, name, seconds in rows:
        ref = {n: s for sh, n, s in rows if sh == shape}
        ratios = [f"{seconds / ref[b]:.2f}" if b in ref else "-" for b in baselines]
        lines.append([shape, name, f"{seconds * 1e6:.1f}", *ratios])
    return header, lines


def _table(header: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" if i < 2 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return "\n".join(fmt.format(*r) for r in [header, *lines])


def benchmark(repeats: int = 15, threads: int | None = None, seed: int = 0,
              scores: str = "normal", device: str = "cpu", clock: str = "wall",
              markdown: Path | None = None) -> int:
    """Time forward+backward of each mapping at each shape of :data:`SHAPES` and print the
    table, with each mapping's ratios to softmax and sparsemax; the exit status, 0.

    Args:
        repeats: timed rounds per mapping.
        threads: torch and numba threads (null: as they are).
        seed: random seed of the scores.
        scores: normal: N(0, 1) per cell; smooth: N(0, 1) averaged over 3 x 3
            neighbourhoods, rescaled to sd 1 (neighbours alike, as in trained models).
        device: torch device: cpu, cuda, cuda:1, ...
        clock: wall: elapsed time; cpu: CPU time of this process, all threads summed
            (steadier than wall time on a machine busy with other work, but blind to
            parallel speed-up).
        markdown: also write the table as markdown to this file, under a line naming the
            machine, the library versions and the date (checked before anything is timed).
    """
    import torch

    where = torch_device(device)
    threads_line = use_threads(threads)
    torch.manual_seed(seed)
    mappings, fallbacks = _mappings(where.type)
    rows, notes = _time_shapes(mappings, fallbacks, where, scores, CLOCKS[clock], repeats)
    name = torch.cuda.get_device_name(where) if where.type == "cuda" else "CPU"
    settings = (f"forward+backward, float32, scores {SCORES[scores]}, {clock} clock, "
                f"{threads_line}, median of {repeats} rounds")
    print(f"{settings}, {name}, torch {torch.__version__}")
    baselines = [b for b in ("softmax", "sparsemax", "entmax.sparsemax (pkg)") if b in mappings]
    header, cells = _cells(rows, baselines)
    print(_table(header, cells))
    if notes:
        notes.insert(0, f"TVmax device solver, same scores at every call ({SCORES[scores]}):")
        print("\n".join(notes))
    write_markdown(markdown, where, f"Settings: {settings}.",
                   markdown_table(header, cells, text_columns=2),
                   ["<br>\n".join(notes)] if notes else [])
    return 0


def _time_shapes(mappings: dict[str, Callable], fallbacks: dict[str, list[int]], device,
                 scores: str, clock: Callable[[], float], repeats: int
                 ) -> tuple[list[tuple[str, str, float]], list[str]]:
    """The rows (shape, mapping, median seconds per call) of every shape of the device, the
    mappings timed in interleaved rounds, and the notes of the TVmax device solver's grids
    left to the CPU."""
    import torch

    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows, notes = [], []
    for batch, height, width in SHAPES[device.type]:
        shape = f"{batch}x{height}x{width}"
        z = _scores(scores, (batch, height, width), device).requires_grad_()
        grad = torch.randn(batch, height, width, device=device)
        for counts in fallbacks.values():
            counts[:] = [0, 0]
        timers = {name: _timer(fn, z, grad, clock, synchronize) for name, fn in mappings.items()}
        samples = {name: [] for name in mappings}
        for _ in range(repeats):
            for name, one_round in timers.items():
                samples[name].append(one_round())
        rows += [(shape, name, statistics.median(s)) for name, s in samples.items()]
        notes += [f"{shape} {name}: {left} of {grids} grids left to the CPU solver"
                  for name, (grids, left) in fallbacks.items() if grids]
        print(f"done {shape}", file=sys.stderr, flush=True)  # progress, not the table
    return rows, notes
