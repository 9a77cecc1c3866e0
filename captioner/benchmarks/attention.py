"""``captioner bench attention``: time forward+backward of the attention mappings side by side.

Scores ~ N(0, 1) of shape (batch, H, W), float32, CPU. Each timed call is one forward pass and
one backward pass of a random upstream gradient. 1-D mappings run over the H*W cells of each
grid (row-major); TVmax runs on the grid. Warm-up calls (numba compilation included) are not
timed. The mappings are timed in interleaved rounds and each reports its median over rounds, so
that load from other processes hits all of them alike and the ratios stay comparable.

Every call of a shape reuses the same scores. The TVmax kernel branches on the data, and at batch
64 the CPU's branch predictors partly learn the repeated input; at batch 1024 they cannot, so
that row is closer to TVmax's cost on fresh scores (as in training).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

HELP = "time forward+backward of softmax, sparsemax, entmax15 and TVmax (ratios printed)"

SHAPES = ((64, 8, 8), (1024, 8, 8), (64, 14, 14), (1024, 14, 14))
TVMAX_LAMS = (0.01, 0.1)
ROUND_SECONDS = 0.02  # each round repeats a call until it has run at least this long


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="captioner bench attention", description=HELP)
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds per mapping")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch and numba threads (default: as is)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the scores")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: elapsed time; cpu: CPU time of this process, all threads summed (steadier "
        "than wall time on a machine busy with other work, but blind to parallel speed-up)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    return args


def _mappings() -> dict[str, Callable]:
    """name -> f(scores (B, H, W)) -> weights (B, H, W)."""
    from captioner import attention
    from captioner.attention.tvmax import tvmax

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
    for lam in TVMAX_LAMS:
        mappings[f"tvmax lam={lam:g}"] = lambda z, lam=lam: tvmax(z, lam)
    return mappings


def _timer(fn: Callable, z, grad, clock: Callable[[], float]) -> Callable[[], float]:
    """A round: seconds per forward+backward call, over as many calls as fill a round."""

    def call() -> None:
        z.grad = None
        fn(z).backward(grad)

    def one_round() -> float:
        calls = 0
        start = clock()
        while True:
            call()
            calls += 1
            elapsed = clock() - start
            if elapsed >= ROUND_SECONDS:
                return elapsed / calls

    for _ in range(3):
        call()
    return one_round


def _table(rows: list[tuple[str, str, float]], baselines: list[str]) -> str:
    header = ["shape", "mapping", "us/call"] + [f"/{b}" for b in baselines]
    lines = []
    for shape, name, seconds in rows:
        ref = {n: s for sh, n, s in rows if sh == shape}
        ratios = [f"{seconds / ref[b]:.2f}" if b in ref else "-" for b in baselines]
        lines.append([shape, name, f"{seconds * 1e6:.1f}", *ratios])
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" if i < 2 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return "\n".join(fmt.format(*r) for r in [header, *lines])


def main(argv: list[str]) -> int:
    args = _parse(argv)
    import numba
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
        numba.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    mappings = _mappings()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    rows = []
    for batch, height, width in SHAPES:
        shape = f"{batch}x{height}x{width}"
        z = torch.randn(batch, height, width, requires_grad=True)
        grad = torch.randn(batch, height, width)
        timers = {name: _timer(fn, z, grad, clock) for name, fn in mappings.items()}
        samples = {name: [] for name in mappings}
        for _ in range(args.repeats):
            for name, one_round in timers.items():
                samples[name].append(one_round())
        rows += [(shape, name, statistics.median(s)) for name, s in samples.items()]
        print(f"done {shape}", flush=True)
    print(
        f"forward+backward, float32 CPU, {args.clock} clock, torch {torch.__version__}, "
        f"threads torch={torch.get_num_threads()} numba={numba.get_num_threads()}, "
        f"median of {args.repeats} rounds"
    )
    baselines = [b for b in ("softmax", "sparsemax", "entmax.sparsemax (pkg)") if b in mappings]
    print(_table(rows, baselines))
    return 0
