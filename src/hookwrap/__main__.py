"""``hookwrap demo`` trains a small PyTorch model through a hookable loop extended
with callbacks; ``hookwrap bench`` prints the dispatch overhead as ratios to a bare
method call; ``hookwrap run`` runs a training script you cannot edit with weaves and
callbacks applied from outside. (``python -m hookwrap`` is the same command.)"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _at_least_one(text: str) -> int:
    """An argument counting calls: a whole number, at least 1 (argparse
    prints this error with the option's name, and exits with status 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


class _Callback(argparse.Action):
    """``--callback EXPR``: appended, with no condition yet (``--when`` gives one)."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        namespace.callback = [*namespace.callback, value]
        namespace.when = [*namespace.when, None]


class _When(argparse.Action):
    """``--when CONDITION``: the condition of the ``--callback`` just before it."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        if not namespace.callback:
            parser.error(f"--when {value!r}: it applies to the --callback just before it, and there is none: "
                         f"write --callback EXPR --when CONDITION.")
        if namespace.when[-1] is not None:
            parser.error(f"--when {value!r}: --callback {namespace.callback[-1]!r} has --when "
                         f"{namespace.when[-1]!r} already: join them in one (A and B).")
        namespace.when = [*namespace.when[:-1], value]


def main(argv: list[str] | None = None) -> int:
    from . import __version__
    from .integrations import _REGISTRY as presets

    parser = argparse.ArgumentParser(prog="hookwrap", description=__doc__)
    parser.add_argument("--version", action="version", version=f"hookwrap {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train a small PyTorch model through a hookable loop with callbacks")
    demo.add_argument("--epochs", type=int, default=20, help="at most this many epochs (default 20)")
    demo.add_argument("--device", default="cpu", help="cpu (default), cuda (or cuda:N), or mps")
    demo.add_argument("--no-hooks", action="store_true",
                      help="the same run without callbacks, to compare")
    bench = commands.add_parser("bench", help="print hook overhead as ratios to a bare method call")
    bench.add_argument("--number", type=_at_least_one, default=20000, help="calls per timing (default 20000)")
    bench.add_argument("--step", action="store_true",
                       help="also measure the share of a torch training step (needs the torch extra)")
    bench.add_argument("--current-only", action="store_true",
                       help="only the implementation in use, in this process")
    run = commands.add_parser(
        "run", usage="%(prog)s [-h] [--config FILE] [--preset NAME] [--weave [EVENT=]MODULE:ATTR] [--train-only EVENT] "
                     "[--only 'EVENT: CONDITION'] [--callback EXPR [--when CONDITION]] [--stop-as EXCEPTION] [--state FILE] [--step EXPR] script [args ...]",
        help="run a script with weaves and callbacks applied from outside",
        description="Run SCRIPT as `python SCRIPT ARGS...` would (its argv, __main__, sys.path and "
                    "exit status), with join points woven and callbacks registered from outside.",
        epilog="example: hookwrap run --preset torch_optim --weave epoch=__main__:train "
               "--callback 'StepTimer()' train.py --epochs 2. "
               "Surviving a preemption: --callback \"Checkpoint('ck', on_signal='SIGTERM', "
               "model='__main__:model', optimizer='__main__:optimizer')\" saves ck/signal.pt; the same command "
               "with resume_from='signal' added replays the script's first steps without their updates and "
               "goes on from there.",
    )
    run.add_argument("--config", metavar="FILE",
                     help="a run file (TOML) holding these options, kept beside the script: script, args, "
                          "preset, weave, train_only, only, callback (strings, or {expr, when} tables), "
                          "stop_as, state, step; options given here as well add to its lists and replace its "
                          "single values")
    run.add_argument("--preset", action="append", default=[], metavar="NAME",
                     help="apply a ready-made weave of hookwrap.integrations: " + ", ".join(
                         f"{name} ({preset.weaves})" for name, preset in presets.items() if preset.from_cli))
    run.add_argument("--weave", action="append", default=[], metavar="[EVENT=]MODULE:ATTR",
                     help="make a function (MODULE:FUNCTION) or method (MODULE:CLASS.METHOD) a join point, "
                          "named EVENT if given; __main__:NAME is the script's own")
    run.add_argument("--train-only", action="append", default=[], metavar="EVENT",
                     help="calls of the function woven as EVENT fire callbacks only with gradients enabled: "
                          "an evaluation under torch.no_grad() (or inference_mode) is left out "
                          "(--weave loss=torch.nn.functional:cross_entropy --train-only loss)")
    run.add_argument("--only", action="append", default=[], metavar="'EVENT: CONDITION'",
                     help="calls of the function woven as EVENT fire callbacks only when CONDITION, a Python "
                          "expression of its arguments and the script's globals, is true "
                          "(--only 'evaluate: data_source is val_data': the script's test-set evaluation "
                          "is left out)")
    run.add_argument("--callback", action=_Callback, default=[], metavar="EXPR",
                     help="a Python expression making a callback, with hw and hookwrap.torch's names in scope "
                          "(\"NanGuard(events='loss')\"), and the modules it names imported "
                          "(\"mypackage.callbacks.Saver()\"); registered on the global tier")
    run.add_argument("--when", action=_When, default=[], metavar="CONDITION",
                     help="the --callback just before it fires only where CONDITION, a Python expression of "
                          "obj (the object whose method was called: an optimizer, for --preset torch_optim) "
                          "and the script's globals, is true: --callback \"GradNorm(model='__main__:netD', "
                          "event='step', name='grad_norm_D')\" --when 'obj is optimizerD' (its steps are "
                          "then optimizerD's)")
    run.add_argument("--stop-as", metavar="EXCEPTION",
                     help="deliver a callback's stop (EarlyStopping, TimeLimit) to the script as EXCEPTION "
                          "(KeyboardInterrupt, or MODULE:NAME), raised from the --weave join point where it "
                          "was decided, so that a script leaving training early its own way (except "
                          "KeyboardInterrupt:) runs its ending; by default the stop ends the script there")
    run.add_argument("--state", metavar="FILE",
                     help="keep the callbacks' state across the script's own resume: each torch.save of the "
                          "script writes it to FILE, and its torch.load of that checkpoint (--init_from=resume) "
                          "gives it back, so best values, patience and step counts go on")
    run.add_argument("--step", metavar="EXPR",
                     help="number the MetricsLogger's rows by the script's own step counter, EXPR a Python "
                          "expression of its globals read when a row is logged (--step iter_num: nanoGPT's "
                          "iteration, before and after its own resume); by default the optimizer steps counted")
    # One REMAINDER for the script and its arguments: argparse hands it what follows
    # the script as written. A positional `script` of its own would take a `--` right
    # after it as its own end-of-options mark, and the script would never see it
    # (`python s.py -- -x` gives the script ['--', '-x']).
    run.add_argument("script", nargs=argparse.REMAINDER, metavar="script [args ...]",
                     help="the script to run, then its arguments, passed to it as python passes them")
    traced = commands.add_parser(
        "trace", usage="%(prog)s [-h] [--steps N] script [args ...]",
        help="run a script's first steps and say what it calls per step, with a hookwrap run command",
        description="Run SCRIPT as hookwrap run does for its first --steps optimizer steps, list what it "
                    "calls per step (its own functions, loss functions with gradients on and off, "
                    "backward, each optimizer's step, an evaluation under torch.no_grad()), and print a "
                    "hookwrap run command that logs its loss, its evaluation and its updates.")
    traced.add_argument("--steps", type=_at_least_one, default=20, help="optimizer steps to run (default 20)")
    traced.add_argument("script", nargs=argparse.REMAINDER, metavar="script [args ...]",
                        help="the script to run, then its arguments")
    args = parser.parse_args(argv)
    if args.command == "run":
        from ._script_runner import run as run_script

        command = _script_command(args.script)
        if args.config is not None:
            from ._run_file import RunFileError, read_run_file

            try:
                command = _with_run_file(args, read_run_file(args.config), command)
            except RunFileError as exc:
                print(exc, file=sys.stderr)
                return 2
        if not command:
            run.error("the following arguments are required: script (or script = \"...\" in a --config file)")
        return run_script(command[0], command[1:], args.preset, args.weave, args.callback,
                          train_only=args.train_only, only=args.only, stop_as=args.stop_as,
                          state=args.state, when=args.when, step=args.step)
    if args.command == "trace":
        from ._trace import trace

        command = _script_command(args.script)
        if not command:
            traced.error("the following arguments are required: script")
        return trace(command[0], command[1:], steps=args.steps)
    if args.command == "demo":
        return _demo(demo, args)
    from ._bench import main as bench_main

    return bench_main(number=args.number, both=not args.current_only, step=args.step)


def _script_command(words: list[str]) -> list[str]:
    """The script and its arguments as written after hookwrap's options; a leading
    ``--`` (``hookwrap run [options] -- script.py ...``) ends those options."""
    return list(words[1:] if words[:1] == ["--"] else words)


def _with_run_file(args: argparse.Namespace, file: Any, command: list[str]) -> list[str]:
    """The run file's options under the command line's: its lists first, then what the
    command line adds; its single values where the command line gives none; its
    script and arguments where the command line names no script."""
    for key, values in file.lists.items():
        if key != "args":
            setattr(args, key, [*values, *getattr(args, key)])
    for key, value in file.single.items():
        if key != "script" and getattr(args, key) is None:
            setattr(args, key, value)
    args.callback = [expr for expr, _ in file.callbacks] + args.callback
    args.when = [when for _, when in file.callbacks] + args.when
    if "script" in file.single and (not command or command[0].startswith("-")):
        # `hookwrap run --config run.toml -- --epochs 2`: arguments for the file's script
        return [file.single["script"], *file.lists.get("args", []), *command]
    return command


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
    problem = _device_problem(torch, args.device)
    if problem:
        parser.error(f"--device {args.device}: {problem}")
    from .demo import run

    run(epochs=args.epochs, device=args.device, hooks=not args.no_hooks)
    return 0


def _device_problem(torch: Any, name: str) -> str | None:
    """Why the demo cannot train on device ``name`` here, or None."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        return "not a device torch knows; use cpu, cuda (cuda:N) or mps"
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available here; use --device cpu"
        if device.index is not None and device.index >= torch.cuda.device_count():
            return f"this machine has {torch.cuda.device_count()} CUDA device(s); use cuda:0 to cuda:{torch.cuda.device_count() - 1}"
        return None
    if device.type == "mps":
        return None if torch.backends.mps.is_available() else "MPS is not available here; use --device cpu"
    return f"the demo trains on cpu, cuda or mps, not {device.type}"


if __name__ == "__main__":
    sys.exit(main())
