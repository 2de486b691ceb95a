"""``hookwrap demo`` trains a small PyTorch model through a hookable loop extended
with callbacks; ``hookwrap bench`` prints the dispatch overhead as ratios to a bare
method call. (``python -m hookwrap`` is the same command.)"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hookwrap", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train a small PyTorch model through a hookable loop with callbacks")
    demo.add_argument("--epochs", type=int, default=20, help="at most this many epochs (default 20)")
    demo.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    demo.add_argument("--no-hooks", action="store_true",
                      help="the same run without callbacks, to compare")
    bench = commands.add_parser("bench", help="print hook overhead as ratios to a bare method call")
    bench.add_argument("--number", type=int, default=20000, help="calls per timing (default 20000)")
    bench.add_argument("--step", action="store_true",
                       help="also measure the share of a torch training step (needs the torch extra)")
    bench.add_argument("--current-only", action="store_true",
                       help="only the implementation in use, in this process")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(parser, args)
    from .bench import main as bench_main

    return bench_main(number=args.number, both=not args.current_only, step=args.step)


def _demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import warnings

    from .demo import NEEDS

    # torch notes at import that NumPy is absent; the demo does not need it.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        import torch
        import tqdm  # noqa: F401
    except ImportError:
        print(NEEDS, file=sys.stderr)
        return 2
    if args.epochs < 1:
        parser.error(f"--epochs must be at least 1, got {args.epochs}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here; use --device cpu")
    from .demo import run

    run(epochs=args.epochs, device=args.device, hooks=not args.no_hooks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
