"""``hookwrap run``: a training script nobody edits, run with weaves and callbacks
applied from outside. ``tests/core/scripts/mnist_style.py`` is a pytorch/examples
MNIST-style script (module-level ``train``/``test``, argparse, an LR scheduler) on
synthetic data: 640 samples in batches of 64 (10 optimizer steps an epoch), 256
test samples in one batch."""

from __future__ import annotations

import importlib
import os
import pickle
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hookwrap.integrations import PRESETS  # every preset, in the error naming them (read at collection)

torch = pytest.importorskip("torch", reason="needs the torch extra")

SCRIPT = Path(__file__).parent / "scripts" / "mnist_style.py"
STEPS_PER_EPOCH = 10  # 640 / 64
WEAVES = ["epoch=__main__:train", "evaluate=__main__:test", "loss=torch.nn.functional:nll_loss"]


def _runner(hw: Any) -> Any:
    return importlib.import_module("hookwrap._script_runner")


def _hookwrap_run(hw: Any, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m hookwrap run ...`` in a fresh process, on the fixture's dispatch."""
    env = dict(os.environ, HOOKWRAP_NO_EXTENSIONS="" if hw.USING_EXTENSION else "1")
    return subprocess.run([sys.executable, "-m", "hookwrap", "run", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _state() -> dict[str, Any]:
    """What a run must leave as it found it."""
    import torch.nn.functional as F

    return {"nll_loss": F.nll_loss, "argv": sys.argv[:], "path": sys.path[:], "main": sys.modules["__main__"],
            "steps": {c: vars(c).get("step") for c in (torch.optim.Optimizer, torch.optim.Adadelta, torch.optim.SGD)},
            "init_subclass": "__init_subclass__" in vars(torch.optim.Optimizer)}


# --- in this process: exact counts -------------------------------------------------


def test_counts_every_step_epoch_evaluation_and_loss_and_restores_everything(hw, capsys):
    counts = {"step": 0, "epoch": 0, "evaluate": [], "loss": 0, "lr": []}

    class Counter(hw.Callback):
        def pre_step(self, optimizer: Any) -> None:
            counts["step"] += 1
            counts["lr"].append(optimizer.param_groups[0]["lr"])

        def post_epoch(self) -> None:  # a plain function join point: no object
            counts["epoch"] += 1

        def post_evaluate(self, return_value: float) -> float:
            counts["evaluate"].append(return_value)
            return return_value

        def post_loss(self) -> None:
            counts["loss"] += 1

    before = _state()
    status = _runner(hw).run(str(SCRIPT), ["--epochs", "3", "--gamma", "0.5"], presets=["torch_optim"],
                             weaves=WEAVES, callbacks=[Counter()])
    out = capsys.readouterr().out
    assert status == 0
    assert counts["step"] == 3 * STEPS_PER_EPOCH == 30
    assert counts["epoch"] == 3
    assert len(counts["evaluate"]) == 3 and out.count("Test set: Average loss") == 3
    assert [f"{v:.4f}" for v in counts["evaluate"]] == [
        line.split("Average loss: ")[1].split(",")[0] for line in out.splitlines() if "Average loss" in line]
    assert counts["loss"] == 30 + 3  # each training batch, and the one test batch an epoch
    assert counts["lr"] == [1.0] * 10 + [0.5] * 10 + [0.25] * 10  # the scheduler ran, once per epoch
    assert _state() == before


def test_a_class_of_the_script_is_woven_when_the_script_defines_it(hw, capsys):
    forwards = []
    status = _runner(hw).run(str(SCRIPT), ["--epochs", "2"], weaves=["__main__:Net.forward"],
                             callbacks=[("post-forward", lambda self, return_value: forwards.append(
                                 (type(self).__name__, tuple(return_value.shape))) or return_value)])
    assert status == 0
    assert forwards == ([("Net", (64, 4))] * STEPS_PER_EPOCH + [("Net", (256, 4))]) * 2


def test_step_timer_counts_optimizer_steps(hw, capsys):
    from hookwrap.torch import StepTimer

    timer = StepTimer()
    assert _runner(hw).run(str(SCRIPT), ["--epochs", "2", "--batch-size", "32"], presets=["torch-optim"],
                           callbacks=[timer]) == 0
    assert timer.count == 2 * 20 and all(t > 0 for t in timer.times)
    assert f"hookwrap run: StepTimer: 40 steps, median" in capsys.readouterr().err


def test_nan_guard_stops_the_run_naming_the_step(hw, capsys):
    status = _runner(hw).run(str(SCRIPT), ["--epochs", "2", "--lr", "1e30"], presets=["torch_optim"],
                             weaves=WEAVES, callbacks=["NanGuard(events='loss')"])
    captured = capsys.readouterr()
    assert status == 1
    assert "NonFiniteError: NanGuard: event 'post-loss' returned nan at step 1. " in captured.err
    assert 'mnist_style.py", line' in captured.err and "script_runner.py" not in captured.err
    assert "Test set" not in captured.out  # stopped in the first epoch


def test_best_checkpoint_saves_the_model_test_is_given(hw, tmp_path, capsys):
    # test(model, device, test_loader): the model is an argument of a module function.
    from hookwrap.torch import BestCheckpoint

    path = tmp_path / "best.pt"
    saver = BestCheckpoint(path, monitor="return_value", optimizer=None)
    losses: list[float] = []
    weights: list[Any] = []

    class Record(hw.Callback):
        def post_evaluate(self, model: Any, return_value: float) -> float:
            losses.append(return_value)
            weights.append({k: v.clone() for k, v in model.state_dict().items()})
            return return_value

    assert _runner(hw).run(str(SCRIPT), ["--epochs", "3"], weaves=WEAVES, callbacks=[Record(), saver]) == 0
    assert len(losses) == 3 and losses == sorted(losses, reverse=True)  # it learns: each test improves
    saved = torch.load(path, weights_only=True)
    assert saver.saved == 3 and saved["value"] == losses[-1] and "optimizer" not in saved
    assert all(torch.equal(saved["model"][k], v) for k, v in weights[-1].items())


def test_cli_relative_paths_name_files_where_the_command_ran(hw, tmp_path):
    """A script that changes folder before the first row is written: --callback's
    relative paths still name files in the folder the command ran in."""
    probe = _script(tmp_path, """
        import os
        import torch
        os.makedirs("elsewhere", exist_ok=True)
        os.chdir("elsewhere")
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        def compute_loss(x):
            return model(x).pow(2).mean()
        for _ in range(3):
            optimizer.zero_grad()
            compute_loss(torch.ones(4, 2)).backward()
            optimizer.step()
    """)
    result = _hookwrap_run(hw, "--preset", "torch_optim", "--weave", "loss=__main__:compute_loss",
                           "--callback", "MetricsLogger('m.csv', tensorboard=False, flush_secs=None)",
                           "--callback", "MetricsLogger('logs/m2.csv', tensorboard=False)",
                           str(probe), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "m.csv").is_file() and (tmp_path / "logs" / "m2.csv").is_file()
    assert not (tmp_path / "elsewhere" / "m.csv").exists() and not (tmp_path / "elsewhere" / "logs").exists()
    assert len((tmp_path / "m.csv").read_text().splitlines()) == 1 + 3  # the header, a row a step


# --- how the script runs ---------------------------------------------------------------


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "probe.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_argv_main_path_pickling_and_exit_codes(hw, tmp_path, capsys):
    probe = _script(tmp_path, """
        import pickle, sys
        class Point:
            pass
        print(sys.argv[1:], __name__, sys.path[0], __file__ == sys.argv[0] or __file__)
        pickle.loads(pickle.dumps(Point()))  # a class of the script pickles by reference
        if sys.argv[1] == "exit":
            sys.exit(int(sys.argv[2]) if sys.argv[2].isdigit() else sys.argv[2])
        if sys.argv[1] == "raise":
            raise ValueError("boom")
    """)
    run = _runner(hw).run
    assert run(str(probe), ["ok", "--epochs", "3", "--help"]) == 0
    out = capsys.readouterr().out
    assert out == f"['ok', '--epochs', '3', '--help'] __main__ {tmp_path} True\n"
    assert run(str(probe), ["exit", "7"]) == 7
    assert run(str(probe), ["exit", "0"]) == 0
    assert run(str(probe), ["exit", "stopped by the script"]) == 1
    assert "stopped by the script" in capsys.readouterr().err
    assert run(str(probe), ["raise"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):\n") and err.endswith("ValueError: boom\n")
    assert "script_runner" not in err and "probe.py\", line 10, in <module>" in err


@pytest.mark.parametrize("args", [["--", "-x", "a"], ["-x", "a"], ["a", "--", "b"], ["--", "--"], ["--"],
                                  ["--epochs", "2", "--", "x"], ["--help"], []])
def test_the_command_line_gives_the_script_the_argv_python_gives_it(hw, tmp_path, capsys, args):
    # argparse took a `--` right after the script as its own: `-- -x a` reached it as ['-x', 'a'].
    probe = _script(tmp_path, """
        import sys
        def show():
            print(sys.argv[1:])
        show()
    """)
    alone = subprocess.run([sys.executable, str(probe), *args], capture_output=True, text=True, timeout=60)
    main = importlib.import_module("hookwrap.__main__").main
    assert main(["run", str(probe), *args]) == 0
    assert capsys.readouterr().out == alone.stdout == f"{args}\n"
    # hookwrap's own options end at the script, or at a `--` before it.
    assert main(["run", "--weave", "__main__:show", "--", str(probe), *args]) == 0
    assert capsys.readouterr().out == alone.stdout


def test_the_command_line_without_a_script_is_refused(hw, capsys):
    main = importlib.import_module("hookwrap.__main__").main
    for argv in (["run"], ["run", "--"], ["run", "--callback", "StepTimer()"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        assert "the following arguments are required: script" in capsys.readouterr().err


def test_a_module_beside_the_script_and_the_script_by_its_module_name(hw, tmp_path, capsys):
    (tmp_path / "helper.py").write_text("def double(x):\n    return 2 * x\n")
    probe = _script(tmp_path, """
        import helper
        def total(n):
            return sum(helper.double(i) for i in range(n))
        print(total(4))
    """)
    seen = []
    status = _runner(hw).run(str(probe), [], weaves=["helper:double", "probe:total"], callbacks=[
        ("post-double", lambda return_value: seen.append(("double", return_value)) or return_value),
        ("post-total", lambda return_value: seen.append(("total", return_value)) or return_value)])
    assert status == 0 and capsys.readouterr().out == "12\n"
    assert seen == [("double", 0), ("double", 2), ("double", 4), ("double", 6), ("total", 12)]
    assert hw._joinpoints.join_point_of(sys.modules["helper"].double) is None  # un-woven after the run
    del sys.modules["helper"]


COMPOUND_DEFINITIONS = {
    "if": """
        if True:
            def step():
                return "if"
    """,
    "elif-else": """
        if False:
            pass
        elif len("a") == 2:
            pass
        else:
            def step():
                return "else"
    """,
    "try-except": """
        try:
            from no_such_module_xyz import step
        except ImportError:
            def step():
                return "except"
    """,
    "try-else-finally": """
        try:
            pass
        except ImportError:
            pass
        else:
            def step():
                return "else"
        finally:
            pass
    """,
    "finally": """
        try:
            pass
        finally:
            def step():
                return "finally"
    """,
    "with": """
        import contextlib
        with contextlib.nullcontext():
            def step():
                return "with"
    """,
    "for": """
        for _ in range(1):
            def step():
                return "for"
    """,
    "while": """
        while True:
            def step():
                return "while"
            break
    """,
    "nested": """
        if True:
            try:
                import no_such_module_xyz
            except ImportError:
                with open(__file__):
                    def step():
                        return "nested"
    """,
}


@pytest.mark.parametrize("form", list(COMPOUND_DEFINITIONS))
def test_a_function_the_script_defines_inside_a_top_level_compound_statement_is_woven(hw, tmp_path, capsys, form):
    # "never defines 'step'": only the top-level statements themselves were read.
    probe = _script(tmp_path, textwrap.dedent(COMPOUND_DEFINITIONS[form]) + "print(step())\n")
    seen: list[str] = []
    status = _runner(hw).run(str(probe), [], weaves=["__main__:step"],
                             callbacks=[("post-step", lambda return_value: seen.append(return_value) or return_value)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert seen == [captured.out.strip()] and seen[0] in form


def test_a_function_defined_in_the_main_block_is_woven_before_the_block_calls_it(hw, tmp_path, capsys):
    probe = _script(tmp_path, """
        import sys
        if __name__ == "__main__":
            def step(i):
                return i * 10
            for i in range(3):
                step(i)
            sys.exit(0)
    """)
    seen: list[int] = []
    status = _runner(hw).run(str(probe), [], weaves=["__main__:step"],
                             callbacks=[("post-step", lambda return_value: seen.append(return_value) or return_value)])
    assert status == 0, capsys.readouterr().err
    assert seen == [0, 10, 20]


def test_a_function_a_loop_defines_anew_each_time_is_woven_each_time(hw, tmp_path, capsys):
    probe = _script(tmp_path, """
        for scale in (1, 2):
            class Trainer:
                def step(self, i):
                    return i * scale
            def run(i):
                return Trainer().step(i)
            run(3)
        run(4)
    """)
    seen: list[Any] = []
    status = _runner(hw).run(str(probe), [], weaves=["__main__:run", "__main__:Trainer.step"], callbacks=[
        ("post-run", lambda return_value: seen.append(("run", return_value)) or return_value),
        ("post-step", lambda self, return_value: seen.append(("step", return_value)) or return_value)])
    assert status == 0, capsys.readouterr().err
    assert seen == [("step", 3), ("run", 3), ("step", 6), ("run", 6), ("step", 8), ("run", 8)]


def test_a_branch_that_defines_the_woven_name_and_does_not_run_exits_2(hw, tmp_path, capsys):
    probe = _script(tmp_path, """
        print("start")
        if len("a") == 2:
            def step():
                pass
        print("never")
    """)
    assert _runner(hw).run(str(probe), [], weaves=["__main__:step"], callbacks=[("post-step", lambda: None)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "start\n"
    assert captured.err == (
        "hookwrap run: --weave '__main__:step': probe.py did not define 'step' on this run: the branch of its "
        "top-level statement that defines it did not run. Weave a name the script defines whichever way it "
        "runs, or run it so that it defines 'step'.\n")


@pytest.mark.parametrize("kwargs, message", [
    ({"presets": ["torch_optimm"]},
     "--preset 'torch_optimm': no such preset. Did you mean 'torch_optim'? Presets: "
     + ", ".join(sorted(PRESETS)) + "."),
    ({"weaves": ["epoch=__main__:trian"]},
     "--weave 'epoch=__main__:trian': mnist_style.py never defines 'trian' at its top level. "
     "Did you mean 'train'?"),
    ({"weaves": ["loss=torch.nn.functional:nll_los"]}, "has no attribute 'nll_los' to weave. Did you mean 'nll_loss'"),
    ({"weaves": ["no_such_module_xyz:fit"]}, "--weave 'no_such_module_xyz:fit': cannot import 'no_such_module_xyz'"),
    ({"weaves": ["__main__:Net.fowrard"]}, "it has no attribute 'fowrard' to weave. Did you mean 'forward'"),
    ({"weaves": ["loss=torch.nn.functional"]}, "not a target. Write MODULE:FUNCTION or MODULE:CLASS.METHOD"),
    ({"callbacks": ["StepTimr()"]}, "--callback 'StepTimr()': NameError: name 'StepTimr' is not defined. "
                                    "Did you mean 'StepTimer'?"),
    ({"callbacks": ["NanGuard(events='loss'"]}, "--callback \"NanGuard(events='loss'\": SyntaxError"),
    ({"callbacks": ["42"]}, "--callback '42' is a int, not a callback."),
    ({"callbacks": ["StepTimer(step_event='a_stage_no_test_defines')"]},
     "Make the join points it needs with --weave EVENT=MODULE:ATTR or --preset torch_optim."),
    ({"presets": ["torch_optim"], "callbacks": ["NanGuard(events='los')"]}, "--callback \"NanGuard(events='los')\""),
])
def test_bad_input_exits_2_naming_it_and_the_fix(hw, capsys, kwargs, message):
    # (the message's middle is the core's own: "no join point 'train_step' exists", ...)
    before = _state()
    assert _runner(hw).run(str(SCRIPT), ["--epochs", "1"], **kwargs) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # the script never ran
    assert captured.err.startswith("hookwrap run: ") and message in captured.err, captured.err
    assert _state() == before


def _stepping_script(tmp_path: Path) -> Path:
    return _script(tmp_path, """
        def step():
            return 1
        step()
    """)


def test_a_callback_whose_module_fails_to_import_reports_that_import_error(hw, tmp_path, capsys):
    # It said "NameError: name 'brokencb' is not defined": the module was never imported.
    (tmp_path / "brokencb.py").write_text("import hookwrap\nimport no_such_dependency_xyz\n")
    probe = _stepping_script(tmp_path)
    assert _runner(hw).run(str(probe), [], weaves=["__main__:step"], callbacks=["brokencb.Counter()"]) == 2
    assert capsys.readouterr().err == (
        "hookwrap run: --callback 'brokencb.Counter()': importing 'brokencb' failed: ModuleNotFoundError: "
        "No module named 'no_such_dependency_xyz' (brokencb.py, line 2). Install what provides "
        "'no_such_dependency_xyz', then run again.\n")
    assert "brokencb" not in sys.modules


def test_a_callback_of_a_module_the_expression_names_is_imported(hw, tmp_path, capsys):
    (tmp_path / "callbacks_xyz").mkdir()
    (tmp_path / "callbacks_xyz" / "__init__.py").write_text("")
    (tmp_path / "callbacks_xyz" / "counting.py").write_text(textwrap.dedent("""
        import hookwrap
        class Counter(hookwrap.Callback):
            def post_step(self, return_value):
                print("counted", return_value)
                return return_value
    """))
    probe = _stepping_script(tmp_path)
    try:
        assert _runner(hw).run(str(probe), [], weaves=["__main__:step"],
                               callbacks=["callbacks_xyz.counting.Counter()"]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out == "counted 1\n"
    finally:
        for name in ("callbacks_xyz", "callbacks_xyz.counting"):
            sys.modules.pop(name, None)


def test_an_undefined_name_says_to_write_it_with_its_module(hw, tmp_path, capsys):
    assert _runner(hw).run(str(_stepping_script(tmp_path)), [], weaves=["__main__:step"],
                           callbacks=["Saver()"]) == 2
    assert ("hookwrap run: --callback 'Saver()': NameError: name 'Saver' is not defined. A name of another "
            "module: write it with its module (mypackage.callbacks.Saver(...)), which hookwrap run imports. "
            "Give a Python expression making a callback, with these names in scope: ") in capsys.readouterr().err


def test_shipped_names_when_hookwrap_torch_fails_to_import_report_that_import_error(hw, tmp_path, capsys, monkeypatch):
    # It said "NameError: name 'MetricsLogger' is not defined": the failed import was dropped.
    shipped = [name for name in sys.modules if name == "hookwrap.torch" or name.startswith("hookwrap.torch.")]
    for name in shipped:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "hookwrap.torch.metrics_logger", None)  # an import inside fails
    monkeypatch.delattr(hw, "torch", raising=False)
    probe = _stepping_script(tmp_path)
    try:
        for expr, lead in [('MetricsLogger("m.csv")', "name 'MetricsLogger' is not defined, as hookwrap.torch, "
                                                       "whose names --callback has in scope, did not import: "),
                           ('hookwrap.torch.MetricsLogger("m.csv")', ""), ('hw.torch.MetricsLogger("m.csv")', "")]:
            assert _runner(hw).run(str(probe), [], weaves=["__main__:step"], callbacks=[expr]) == 2
            err = capsys.readouterr().err
            assert re.match(  # where the import failed: the first module of hookwrap.torch that makes it
                re.escape(f"hookwrap run: --callback {expr!r}: {lead}importing 'hookwrap.torch' failed: "
                          f"ModuleNotFoundError: import of hookwrap.torch.metrics_logger halted; None in sys.modules (")
                + r"[\w/]+\.py, line \d+\)", err), err
            assert err.endswith("). Install what provides 'hookwrap.torch.metrics_logger', then run again.\n"), err
    finally:
        for name in [n for n in sys.modules if n.startswith("hookwrap.torch") and n not in shipped]:
            del sys.modules[name]  # what the failed import left; the shipped ones come back


def test_a_missing_script_exits_2(hw, tmp_path, capsys):
    assert _runner(hw).run(str(tmp_path / "nope.py"), []) == 2
    assert "no such file" in capsys.readouterr().err


# --- the command line, in a fresh process ---------------------------------------------------


def test_cli_nan_guard_exits_non_zero_naming_the_step(hw, tmp_path):
    result = _hookwrap_run(hw, "--preset", "torch_optim", *[f"--weave={w}" for w in WEAVES],
                           "--callback", "NanGuard(events='loss')", str(SCRIPT), "--epochs", "2", "--lr", "1e30",
                           cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Train Epoch: 1 [0/640 (0%)]" in result.stdout
    assert "NanGuard: event 'post-loss' returned nan at step 1. " in result.stderr


def test_cli_step_timer_and_progress_bar_with_argv_passed_through(hw, tmp_path):
    result = _hookwrap_run(hw, "--preset", "torch_optim", "--weave", "epoch=__main__:train",
                           "--callback", "StepTimer()", "--callback", "ProgressBar(total=10, ncols=80)",
                           str(SCRIPT), "--epochs", "2", "--log-interval", "5", "--save-model", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("Train Epoch:") == 2 * 2 and result.stdout.count("Test set") == 2
    assert "hookwrap run: StepTimer: 20 steps, median " in result.stderr
    assert "epoch 2: 100%" in result.stderr and "10/10" in result.stderr
    assert (tmp_path / "mnist_mlp.pt").exists()  # the script's own cwd-relative output


def test_cli_exit_code_of_the_script_is_kept(hw, tmp_path):
    result = _hookwrap_run(hw, "--preset", "torch_optim", str(SCRIPT), "--epochs", "1",
                           "--max-test-loss", "0.0", cwd=tmp_path)
    assert result.returncode == 3 and "is above 0.0" in result.stderr
    bad = _hookwrap_run(hw, "--preset", "adam", str(SCRIPT), cwd=tmp_path)
    assert bad.returncode == 2 and "hookwrap run: --preset 'adam': no such preset." in bad.stderr


# --- the documentation's commands, as written, on the MNIST-style script as train.py --------

_ROOT = Path(__file__).parents[2]
DOCS_RUNS = [
    (f"{page.relative_to(_ROOT).as_posix()}:{i}", command, shown)
    for page in [_ROOT / "README.md", *sorted((_ROOT / "docs").rglob("*.md"))]
    for i, (command, shown) in enumerate(re.findall(
        r"```bash\n(hookwrap run .*?)\n```\n\n```text\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S))
]


def test_docs_show_hookwrap_run_commands():
    assert len(DOCS_RUNS) == 2


@pytest.mark.parametrize("name", [name for name, _, _ in DOCS_RUNS])
def test_docs_hookwrap_run_command_runs_as_shown(hw, tmp_path, name):
    command, shown = next((command, shown) for n, command, shown in DOCS_RUNS if n == name)
    shutil.copy(SCRIPT, tmp_path / "train.py")
    env = dict(os.environ, HOOKWRAP_NO_EXTENSIONS="" if hw.USING_EXTENSION else "1",
               PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    result = subprocess.run(["bash", "-c", command.replace("\\\n", " ")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    out = result.stdout + result.stderr
    # Timings and progress-bar rates differ from run to run; every other line shown is printed.
    for line in shown.splitlines():
        if line.strip() and not re.search(r"it/s|ms|^\s*\.\.\.|File |^\s+\S", line):
            assert line.split("(...)")[0] in out, (line, out[-3000:])
    if "exit status" not in shown:
        assert result.returncode == 0, out[-3000:]


def test_a_script_using_spawn_multiprocessing_runs_as_it_does_alone(hw, tmp_path):
    # DataLoader workers on macOS/Windows, and CUDA scripts, start processes by spawn:
    # each child runs the script again as __mp_main__ and looks its functions up there.
    (tmp_path / "spawning.py").write_text(textwrap.dedent("""
        import multiprocessing as mp

        def square(x):
            return x * x

        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(1) as pool:
                print(pool.map(square, [1, 2, 3]))
    """))
    result = _hookwrap_run(hw, "spawning.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[1, 4, 9]"


MODULE_LEVEL = '''
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # nothing is learned: the loss stays put
x, y = torch.randn(16, 4), torch.randn(16, 1)


@torch.no_grad()
def evaluate():
    return F.mse_loss(model(x), y).item()


for it in range(100):
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if it % 5 == 4:
        print(f"iter {it + 1}: val {evaluate():.4f}")
print("done")
'''


def test_an_unedited_module_level_loop_ends_cleanly_on_an_early_stop(hw, tmp_path):
    """nanoGPT's shape: a module-level loop, an evaluate() that takes no model, under
    no_grad. The early stop ends the script with status 0 and one line saying why;
    BestCheckpoint names the script's model before it exists; the loss function, woven
    --train-only, counts the training calls, not the evaluation's."""
    (tmp_path / "train.py").write_text(MODULE_LEVEL)
    result = _hookwrap_run(
        hw, "--weave", "evaluate=__main__:evaluate", "--weave", "loss=torch.nn.functional:mse_loss",
        "--train-only", "loss", "--callback", "EarlyStopping('return_value', patience=2)",
        "--callback", "BestCheckpoint('best.pt', monitor='return_value', model='__main__:model', "
                      "optimizer='__main__:optimizer')",
        "--callback", "StepTimer(step_event='loss')",
        "train.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    # Evaluations 1 (best), 2, 3: the third stops the run before the script prints it.
    assert result.stdout.count("val ") == 2 and "done" not in result.stdout
    stopped = [line for line in result.stderr.splitlines() if line.startswith("hookwrap run: stopped: ")]
    assert len(stopped) == 1 and "EarlyStopping: return_value has not improved" in stopped[0]
    assert "hookwrap run: StepTimer: 15 steps" in result.stderr  # the 15 training calls, not the 3 evaluations'
    saved = torch.load(tmp_path / "best.pt", weights_only=False)
    assert set(saved["model"]) == {"weight", "bias"} and "optimizer" in saved


def test_train_only_and_references_refuse_bad_input(hw, tmp_path):
    (tmp_path / "train.py").write_text(MODULE_LEVEL)
    result = _hookwrap_run(hw, "--train-only", "loss", "train.py", cwd=tmp_path)
    assert result.returncode == 2 and "--train-only 'loss': no --weave makes a join point 'loss'" in result.stderr
    result = _hookwrap_run(
        hw, "--weave", "evaluate=__main__:evaluate", "--callback",
        "BestCheckpoint('best.pt', monitor='return_value', model='__main__:modle', optimizer=None)",
        "train.py", cwd=tmp_path)
    assert result.returncode == 1 and "model='__main__:modle': __main__ has no 'modle' (yet)" in result.stderr


WITH_TEST_SET = '''
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
x, y = torch.randn(16, 4), torch.randn(16, 1)
val_data, test_data = (torch.randn(16, 4), torch.randn(16, 1)), (torch.randn(16, 4), torch.randn(16, 1))


def evaluate(data_source):
    with torch.no_grad():
        return F.mse_loss(model(data_source[0]), data_source[1]).item()


for epoch in range(2):
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"epoch {epoch}: val {evaluate(val_data):.4f}")
print(f"test {evaluate(test_data):.4f}")
'''


def test_only_leaves_the_test_set_evaluation_out_and_a_join_point_never_called_is_said(hw, tmp_path):
    """word_language_model's shape: evaluate(val_data) each epoch, evaluate(test_data) at the
    end. With --only the test set is no evaluation (EarlyStopping with patience 2 would
    otherwise stop on it); a woven loss function the script never calls is reported."""
    (tmp_path / "train.py").write_text(WITH_TEST_SET)
    args = ["--weave", "evaluate=__main__:evaluate", "--callback", "EarlyStopping('return_value', patience=2)"]
    result = _hookwrap_run(hw, *args, "train.py", cwd=tmp_path)
    assert "hookwrap run: stopped: EarlyStopping" in result.stderr and "test " not in result.stdout
    result = _hookwrap_run(hw, *args, "--only", "evaluate: data_source is val_data",
                           "--weave", "loss=torch.nn.functional:cross_entropy", "train.py", cwd=tmp_path)
    assert result.returncode == 0 and "stopped" not in result.stderr, result.stderr
    assert result.stdout.count("val ") == 2 and "test " in result.stdout
    assert ("--weave 'loss=torch.nn.functional:cross_entropy': join point 'loss' never fired" in result.stderr)
    assert "join point 'evaluate' never fired" not in result.stderr
    result = _hookwrap_run(hw, "--weave", "evaluate=__main__:evaluate", "--only", "evaluate data_source",
                           "train.py", cwd=tmp_path)
    assert result.returncode == 2 and "--only 'evaluate data_source': write EVENT: CONDITION" in result.stderr


def test_messages_name_what_a_command_line_user_can_type(hw, tmp_path):
    (tmp_path / "train.py").write_text(WITH_TEST_SET)
    result = _hookwrap_run(hw, "--weave", "evaluate=__main__:evaluate", "--callback", "EarlyStopping()",
                           "train.py", cwd=tmp_path)
    assert "returned a float, not a mapping holding 'val_loss': monitor='return_value'" in result.stderr
    result = _hookwrap_run(hw, "--weave", "evaluate=__main__:evaluate", "--callback",
                           "BestCheckpoint('b.pt', monitor='return_value', optimizer=None)", "train.py", cwd=tmp_path)
    assert "model='__main__:model'" in result.stderr
    result = _hookwrap_run(hw, "--preset", "torch_optim", "--callback", "LRMonitor()", "--callback",
                           "MetricsLogger('m.csv')", "train.py", cwd=tmp_path)
    assert result.returncode == 2 and "pass event='step'" in result.stderr


def test_only_names_arguments_left_to_their_defaults(hw, tmp_path):
    script = WITH_TEST_SET.replace("def evaluate(data_source):", "def evaluate(data_source=val_data):").replace(
        "evaluate(val_data)", "evaluate()")
    (tmp_path / "train.py").write_text(script)
    result = _hookwrap_run(hw, "--weave", "evaluate=__main__:evaluate", "--only", "evaluate: data_source is val_data",
                           "--callback", "EarlyStopping('return_value', patience=2)", "train.py", cwd=tmp_path)
    assert result.returncode == 0 and "test " in result.stdout and "stopped" not in result.stderr, result.stderr
    result = _hookwrap_run(hw, "--weave", "evaluate=__main__:evaluate", "--only", "evaluate: data is val_data",
                           "train.py", cwd=tmp_path)
    assert result.returncode == 1 and "--only 'evaluate: data is val_data' failed on this call: NameError" \
        in result.stderr and "(data_source)" in result.stderr


_PRESETS = importlib.import_module("hookwrap.integrations")._REGISTRY  # imports no framework


@pytest.mark.parametrize("preset", [name for name, preset in _PRESETS.items()
                                    if preset.from_cli and preset.framework != "torch"])
def test_a_preset_whose_framework_is_not_installed_exits_2_saying_what_to_install(hw, tmp_path, capsys,
                                                                                monkeypatch, preset):
    # It ended in a ModuleNotFoundError traceback from inside the preset's weave().
    framework, extra = _PRESETS[preset].framework, _PRESETS[preset].extra
    for name in [n for n in sys.modules if n == framework or n.startswith(framework + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, framework, None)  # as if it were not installed
    assert _runner(hw).run(str(_stepping_script(tmp_path)), [], presets=[preset]) == 2
    # DeepSpeed builds against the torch installed: without build isolation (docs/guide/integrations.md).
    how = "DS_BUILD_OPS=0 pip install --no-build-isolation" if extra == "deepspeed" else "pip install"
    assert capsys.readouterr().err == (
        f"hookwrap run: --preset {preset!r} needs {framework}, which is not installed here: install it "
        f"({how} 'hookwrap[{extra}]' torch==2.13.0, or your own version of {framework}).\n")


_LEAVES_EARLY = """
    def evaluate(epoch):
        return [3.0, 2.0, 2.5, 2.6, 2.7, 2.8][epoch]
    history = []
    try:
        for epoch in range(6):
            history.append(evaluate(epoch))
            print(f"epoch {epoch} val {history[-1]}")
    except KeyboardInterrupt:  # as pytorch/examples word_language_model leaves training early
        print("Exiting from training early")
    print(f"test loss {min(history)}")
"""


def test_stop_as_delivers_the_stop_as_the_scripts_own_early_exit(hw, tmp_path, capsys):
    """--stop-as KeyboardInterrupt: EarlyStopping's stop reaches the script as the
    KeyboardInterrupt it catches to leave training early, so its ending runs (the
    test evaluation); status 0 and a line on stderr saying so. Without it the stop
    ends the script where it was decided."""
    probe = _script(tmp_path, _LEAVES_EARLY)
    run = _runner(hw).run
    options = dict(weaves=["evaluate=__main__:evaluate"], callbacks=["EarlyStopping('return_value', patience=2)"])
    status = run(str(probe), [], stop_as="KeyboardInterrupt", **options)
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.splitlines() == [f"epoch {e} val {v}" for e, v in enumerate([3.0, 2.0, 2.5])] + [
        "Exiting from training early", "test loss 2.0"]
    assert "stopped: EarlyStopping" in err and "delivered as KeyboardInterrupt: the script's own ending ran" in err
    assert run(str(probe), [], **options) == 0
    out, err = capsys.readouterr()
    assert "test loss" not in out and "its code after that point did not run" in err


def test_stop_as_a_stop_the_script_does_not_catch_still_ends_it_as_a_stop(hw, tmp_path, capsys):
    probe = _script(tmp_path, _LEAVES_EARLY.replace("except KeyboardInterrupt:", "except ValueError:"))
    status = _runner(hw).run(str(probe), [], weaves=["evaluate=__main__:evaluate"], stop_as="KeyboardInterrupt",
                             callbacks=["EarlyStopping('return_value', patience=2)"])
    out, err = capsys.readouterr()
    assert status == 0 and "test loss" not in out
    assert "delivered as KeyboardInterrupt, which the script did not catch" in err


@pytest.mark.parametrize(("stop_as", "weaves", "message"), [
    ("KeyboardInterupt", ["evaluate=__main__:evaluate"], r"no built-in exception of that name\. Did you mean "
                                                         r"'KeyboardInterrupt'"),
    ("hookwrap:StopTraining", ["evaluate=__main__:evaluate"], r"not an exception class the script could catch"),
    ("no_such_module:Error", ["evaluate=__main__:evaluate"], r"No module named 'no_such_module'"),
    ("KeyboardInterrupt", [], r"there is none\. Weave the function the stop is decided on"),
])
def test_stop_as_is_checked_before_the_script_runs(hw, tmp_path, capsys, stop_as, weaves, message):
    probe = _script(tmp_path, "def evaluate():\n    return 1.0\nprint('ran')\n")
    assert _runner(hw).run(str(probe), [], weaves=weaves, stop_as=stop_as) == 2
    out, err = capsys.readouterr()
    assert out == "" and re.search(message, err), err


_RESUMES_ITSELF = """
    import argparse, os
    import torch
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--iters", type=int)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    VALS = [5.0, 4.0, 3.0, 3.5, 3.6, 3.7, 3.8, 3.9, 4.0, 4.1, 4.2]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    iter_num = 0
    ckpt = os.path.join(args.out, "ckpt.pt")
    if args.resume:  # as nanoGPT's --init_from=resume
        checkpoint = torch.load(ckpt)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        iter_num = checkpoint["iter_num"]
    def estimate_loss():
        return VALS[iter_num // 2]
    while iter_num < args.iters:
        if iter_num % 2 == 0:  # nanoGPT: evaluate, then save, at the top of the iteration
            print(f"iter {iter_num}: val {estimate_loss()}")
            if iter_num > 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "iter_num": iter_num}, ckpt)
        loss = torch.nn.functional.mse_loss(model(torch.ones(8, 4) * iter_num), torch.zeros(8, 1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        iter_num += 1
    print("done", iter_num)
"""


def test_state_goes_on_across_the_scripts_own_resume(hw, tmp_path, capsys):
    """--state: the script saves at iter 6 and ends at 7; resumed from its checkpoint it
    evaluates iter 6 again. EarlyStopping then stops at iter 8 with the message the
    uninterrupted run gives (its patience and step count went on, and the evaluation
    redone counted once); afresh (no --state) it runs on to iter 10."""
    probe = _script(tmp_path, _RESUMES_ITSELF)
    run = _runner(hw).run
    options = dict(presets=["torch_optim"], weaves=["evaluate=__main__:estimate_loss"],
                   callbacks=["EarlyStopping('return_value', patience=2)"])

    def ran(folder: str, *args: str, state: str | None = None) -> tuple[list[str], str]:
        (tmp_path / folder).mkdir(exist_ok=True)
        status = run(str(probe), ["--out", str(tmp_path / folder), *args], state=state, **options)
        out, err = capsys.readouterr()
        assert status == 0, err
        return out.splitlines(), next((line for line in err.splitlines() if "stopped:" in line), "")

    straight, straight_stop = ran("straight", "--iters", "20")
    assert straight[-1] == "iter 6: val 3.5" and "at step 4, now 3.6" in straight_stop  # iter 8's unprinted
    state = str(tmp_path / "run" / "hookwrap.state.pt")
    first, _ = ran("run", "--iters", "7", state=state)
    assert first[-1] == "done 7" and os.path.isfile(state)
    resumed, resumed_stop = ran("run", "--iters", "20", "--resume", state=state)
    assert resumed == ["iter 6: val 3.5"] and resumed_stop == straight_stop
    capsys.readouterr()
    ran("fresh", "--iters", "7")
    shutil.copy(tmp_path / "run" / "ckpt.pt", tmp_path / "fresh" / "ckpt.pt")
    afresh, _ = ran("fresh", "--iters", "20", "--resume")
    assert afresh[-1] == "iter 8: val 3.6"  # stopped at iter 10


def test_state_of_another_checkpoint_or_a_changed_one_is_not_taken(hw, tmp_path, capsys):
    probe = _script(tmp_path, _RESUMES_ITSELF)
    run = _runner(hw).run
    options = dict(presets=["torch_optim"], weaves=["evaluate=__main__:estimate_loss"],
                   callbacks=["EarlyStopping('return_value', patience=2)"], state=str(tmp_path / "s.pt"))
    assert run(str(probe), ["--out", str(tmp_path), "--iters", "7"], **options) == 0
    capsys.readouterr()
    torch.save({"model": {}, "optimizer": {}, "iter_num": 6}, tmp_path / "ckpt.pt")  # saved outside the run
    assert run(str(probe), ["--out", str(tmp_path), "--iters", "20", "--resume"], **options) == 1
    err = capsys.readouterr().err
    assert "changed since the callbacks' state was saved with it" in err  # said; then the script's own error


def test_state_that_is_not_a_state_file_is_refused_before_the_script_runs(hw, tmp_path, capsys):
    probe = _script(tmp_path, "print('ran')\n")
    torch.save({"something": 1}, tmp_path / "other.pt")
    assert _runner(hw).run(str(probe), [], state=str(tmp_path / "other.pt")) == 2
    out, err = capsys.readouterr()
    assert out == "" and "not a state file hookwrap run wrote" in err
    assert _runner(hw).run(str(probe), [], state=str(tmp_path)) == 2
    assert "is a folder" in capsys.readouterr().err


def test_state_saved_by_other_callbacks_is_refused_naming_them_and_the_fix(hw, tmp_path, capsys):
    """A resume whose --callback options differ from the run that saved the state: the
    error names the callbacks on each side and the fix, and no callback is changed."""
    probe = _script(tmp_path, _RESUMES_ITSELF)
    run = _runner(hw).run
    options = dict(presets=["torch_optim"], weaves=["evaluate=__main__:estimate_loss"], state=str(tmp_path / "s.pt"))
    assert run(str(probe), ["--out", str(tmp_path), "--iters", "7"],
               callbacks=["EarlyStopping('return_value', patience=2)"], **options) == 0
    capsys.readouterr()
    assert run(str(probe), ["--out", str(tmp_path), "--iters", "20", "--resume"],
               callbacks=["EarlyStopping('return_value', mode='max')"], **options) == 1
    err = capsys.readouterr().err
    assert ("saved state for 'EarlyStopping[monitor=return_value,mode=min]', which no attached callback takes; "
            "no saved state for attached 'EarlyStopping[monitor=return_value,mode=max]'") in err, err
    assert "Resume with the --callback options of the run that saved it" in err


def test_state_resume_gives_the_uninterrupted_runs_csv(hw, tmp_path, capsys):
    """--state with a MetricsLogger: the run saved at iter 6, went on to 7 and ended;
    resumed from its checkpoint, the CSV (losses and evaluations, at their steps)
    equals the uninterrupted run's, and the rows the resumed run logged again are
    in metrics.before-resume.csv."""
    probe = _script(tmp_path, _RESUMES_ITSELF)
    run = _runner(hw).run

    def ran(folder: str, *args: str, state: str | None = None) -> str:
        out = tmp_path / folder
        out.mkdir(exist_ok=True)
        status = run(str(probe), ["--out", str(out), *args], state=state, presets=["torch_optim"],
                     weaves=["evaluate=__main__:estimate_loss", "loss=torch.nn.functional:mse_loss"],
                     callbacks=["EarlyStopping('return_value', patience=2)",
                                f"MetricsLogger({str(out / 'metrics.csv')!r}, tensorboard=False)"])
        err = capsys.readouterr().err
        assert status == 0, err
        return err

    ran("straight", "--iters", "20")
    state = str(tmp_path / "run" / "hookwrap.state.pt")
    ran("run", "--iters", "7", state=state)
    with pytest.warns(hw.HookwrapWarning, match=r"rows of steps 6-6 were written, and logs from step 6 again"):
        ran("run", "--iters", "20", "--resume", state=state)
    straight = (tmp_path / "straight" / "metrics.csv").read_text().splitlines()
    assert (tmp_path / "run" / "metrics.csv").read_text().splitlines() == straight
    assert [row.split(",")[1] for row in straight].count("metric") == 5  # iters 0-8: the stop decided at 8
    aside = (tmp_path / "run" / "metrics.before-resume.csv").read_text().splitlines()
    assert aside[1:] == [row for row in straight[1:] if int(row.split(",")[0]) == 6]



@pytest.mark.parametrize("weaves", [["loss=torch.nn.functional:mse_loss"], []])
def test_state_without_a_step_join_point_counts_the_redone_evaluation_once(hw, tmp_path, weaves):
    """No step join point (the script updates by hand, or no preset): the loss's calls
    with gradients mark training, so the evaluation the resumed run redoes replaces the
    one the checkpoint saw: the CSV and EarlyStopping's stop are the uninterrupted
    run's. With no loss either, nothing tells it apart, and the resume says so. In a
    process of its own: which join points exist is what is tested, and in this one
    earlier tests leave some named loss and step alive."""
    probe = _script(tmp_path, _RESUMES_ITSELF)

    def ran(folder: str, *args: str, state: str | None = None) -> str:
        out = tmp_path / folder
        out.mkdir(exist_ok=True)
        options = [option for weave in ["evaluate=__main__:estimate_loss", *weaves] for option in ("--weave", weave)]
        result = _hookwrap_run(hw, *options, *(["--state", state] if state else []),
                               "--callback", "EarlyStopping('return_value', patience=2)",
                               "--callback", f"MetricsLogger({str(out / 'metrics.csv')!r}, tensorboard=False)",
                               str(probe), "--out", str(out), *args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return result.stderr

    def stop(err: str) -> str:
        return next((line for line in err.splitlines() if "stopped:" in line), "")

    straight = ran("straight", "--iters", "20")
    state = str(tmp_path / "run" / "hookwrap.state.pt")
    ran("run", "--iters", "7", state=state)
    resumed = ran("run", "--iters", "20", "--resume", state=state)
    rows = (tmp_path / "run" / "metrics.csv").read_text()
    if weaves:
        assert stop(resumed) == stop(straight) and "now 3.6" in stop(straight)
        assert "moved to" in resumed  # the rows logged again, set aside
        assert rows == (tmp_path / "straight" / "metrics.csv").read_text()
    else:
        assert "was saved after an evaluation; if the script does it again, it counts twice" in resumed
        assert "--preset torch_optim" in resumed and rows.count("metric,3.5") == 2  # said, as it happens


def test_step_numbers_the_rows_by_the_scripts_own_counter_across_its_resume(hw, tmp_path, capsys):
    """--step iter_num: the script resumed its own way (no --state) logs its rows at
    its iteration, as the run that never stopped did; counted afresh they would start
    at step 0 again. Bad input is refused before the script runs."""
    probe = _script(tmp_path, _RESUMES_ITSELF)
    run = _runner(hw).run

    def rows(csv_name: str, *args: str, step: str | None = "iter_num") -> list[tuple[int, str, str]]:
        path = tmp_path / csv_name
        status = run(str(probe), ["--out", str(tmp_path), *args], presets=["torch_optim"], step=step,
                     weaves=["evaluate=__main__:estimate_loss", "loss=torch.nn.functional:mse_loss"],
                     callbacks=[f"MetricsLogger({str(path)!r}, tensorboard=False)"])
        assert status == 0, capsys.readouterr().err
        return [(int(r.split(",")[0]), r.split(",")[1], r.split(",")[2]) for r in path.read_text().splitlines()[1:]]

    straight = rows("straight.csv", "--iters", "10")
    assert [s for s, name, _ in straight if name == "loss"] == list(range(10))
    rows("first.csv", "--iters", "7")
    resumed = rows("resumed.csv", "--iters", "10", "--resume")
    assert resumed == [row for row in straight if row[0] >= 6]  # iter 6 on, at iter 6 on
    afresh = rows("afresh.csv", "--iters", "10", "--resume", step=None)
    assert [s for s, name, _ in afresh if name == "loss"] == [0, 1]  # iters 8 and 9 (the last checkpoint's)
    capsys.readouterr()
    for step, message in (("iter num", "not a Python expression"), ("no_such_counter", "failed when a row was "
                                                                                      "logged: NameError")):
        status = run(str(probe), ["--out", str(tmp_path), "--iters", "2"], presets=["torch_optim"], step=step,
                     weaves=["loss=torch.nn.functional:mse_loss"], callbacks=["MetricsLogger('m.csv')"])
        assert status in (1, 2) and message in capsys.readouterr().err
    assert run(str(probe), [], step="iter_num", callbacks=["StepTimer()"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "numbers the rows of the run's MetricsLogger, and it has none" in err

_TWO_MODELS = """
    import torch
    torch.manual_seed(0)
    netD, netG = torch.nn.Linear(4, 1), torch.nn.Linear(2, 4)
    optimizerD = torch.optim.SGD(netD.parameters(), lr=0.01)
    optimizerG = torch.optim.SGD(netG.parameters(), lr=0.01)
    for i in range(3):  # as dcgan: D's update, then G's
        netD.zero_grad()
        real = torch.randn(8, 4)
        errD = netD(real).mean() - netD(netG(torch.randn(8, 2)).detach()).mean()
        errD.backward()
        optimizerD.step()
        netG.zero_grad()
        errG = -netD(netG(torch.randn(8, 2))).mean()
        errG.backward()
        optimizerG.step()
    print("done")
"""


def test_measuring_callbacks_log_into_the_runs_metrics_logger_each_under_its_name(hw, tmp_path, capsys):
    """dcgan's two models: a GradNorm for each, named, kept to its own optimizer's
    steps with --when, logs into the run's MetricsLogger (a command line cannot pass
    it one): D's norms at D's update count, G's at G's, each equal to the norm of its
    model's gradients after its own update, computed here by hand. Without a
    MetricsLogger, or with two under one name, the run is refused before the script
    runs."""
    probe = _script(tmp_path, _TWO_MODELS + """
    import json, os
    norms = json.loads(os.environ.get("NORMS_BY_HAND", "{}"))
    """)
    run = _runner(hw).run
    csv = tmp_path / "m.csv"
    norms = ["GradNorm(model='__main__:netD', event='step', name='grad_norm_D')",
             "GradNorm(model='__main__:netG', event='step', name='grad_norm_G')"]
    assert run(str(probe), [], presets=["torch_optim"], when=["obj is optimizerD", "obj is optimizerG"],
               callbacks=[*norms, f"MetricsLogger({str(csv)!r}, tensorboard=False)"]) == 0
    rows = [(int(step), name, float(value)) for step, name, value in
            (line.split(",") for line in csv.read_text().splitlines()[1:])]
    by_hand = _two_models_norms()
    for name, expected in by_hand.items():
        got = [(step, value) for step, value_name, value in rows if value_name == name]
        assert [step for step, _ in got] == [1, 2, 3], rows  # its own optimizer's updates
        assert [round(value, 5) for _, value in got] == [round(v, 5) for v in expected], (name, got, expected)
    capsys.readouterr()
    assert run(str(probe), [], presets=["torch_optim"], callbacks=norms[:1]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "logs what it measures into a MetricsLogger, and this run has none" in err
    assert "Add --callback \"MetricsLogger('metrics.csv')\"" in err
    assert run(str(probe), [], presets=["torch_optim"],
               callbacks=["GradNorm(model='__main__:netD', event='step')", "GradNorm(model='__main__:netG', event='step')",
                          f"MetricsLogger({str(csv)!r}, tensorboard=False)"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "both log 'grad_norm' into one MetricsLogger" in err and "name='grad_norm_2'" in err


def test_one_lr_monitor_on_two_optimizers_is_refused_and_one_each_logs_its_own(hw, tmp_path, capsys):
    """LRMonitor on ``step`` with both of dcgan's optimizers: refused at D's second
    update, naming --when and name=; one each, kept by --when, logs each rate at its
    own optimizer's update count."""
    probe = _script(tmp_path, _TWO_MODELS.replace("optimizerG = torch.optim.SGD(netG.parameters(), lr=0.01)",
                                                  "optimizerG = torch.optim.Adam(netG.parameters(), lr=0.002)"))
    run = _runner(hw).run
    csv = tmp_path / "m.csv"
    logger = f"MetricsLogger({str(csv)!r}, tensorboard=False)"
    assert run(str(probe), [], presets=["torch_optim"], callbacks=["LRMonitor(event='step')", logger]) == 1
    err = capsys.readouterr().err
    assert "LRMonitor: event 'step' brings two optimizers in turn (SGD and Adam)" in err
    assert "--when 'obj is optimizerD'" in err and "name='lr_D'" in err
    assert run(str(probe), [], presets=["torch_optim"], when=["obj is optimizerD", "obj is optimizerG"],
               callbacks=["LRMonitor(event='step', name='lr_D')", "LRMonitor(event='step', name='lr_G')",
                          logger]) == 0, capsys.readouterr().err
    rows = [line.split(",") for line in csv.read_text().splitlines()[1:]]
    assert [(step, value) for step, name, value in rows if name == "lr_D"] == [(s, "0.01") for s in "123"]
    assert [(step, value) for step, name, value in rows if name == "lr_G"] == [(s, "0.002") for s in "123"]


def _two_models_norms() -> dict[str, list[float]]:
    """_TWO_MODELS by hand: the gradient norm of each model after its optimizer's step."""
    torch.manual_seed(0)
    netD, netG = torch.nn.Linear(4, 1), torch.nn.Linear(2, 4)
    optimizerD = torch.optim.SGD(netD.parameters(), lr=0.01)
    optimizerG = torch.optim.SGD(netG.parameters(), lr=0.01)
    norms: dict[str, list[float]] = {"grad_norm_D": [], "grad_norm_G": []}

    def norm(model: Any) -> float:
        return float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))

    for _ in range(3):
        netD.zero_grad()
        real = torch.randn(8, 4)
        errD = netD(real).mean() - netD(netG(torch.randn(8, 2)).detach()).mean()
        errD.backward()
        optimizerD.step()
        norms["grad_norm_D"].append(norm(netD))
        netG.zero_grad()
        errG = -netD(netG(torch.randn(8, 2))).mean()
        errG.backward()
        optimizerG.step()
        norms["grad_norm_G"].append(norm(netG))
    return norms


def test_when_is_checked_before_the_script_runs_and_names_its_callback(hw, tmp_path, capsys):
    probe = _script(tmp_path, _TWO_MODELS)
    result = _hookwrap_run(hw, "--when", "obj is optimizerD", "probe.py", cwd=tmp_path)
    assert result.returncode == 2 and "it applies to the --callback just before it, and there is none" \
        in result.stderr
    assert _runner(hw).run(str(probe), [], presets=["torch_optim"], callbacks=["StepTimer()"],
                           when=["obj is"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--when 'obj is' (of --callback 'StepTimer()'): not a Python expression" in err
    assert _runner(hw).run(str(probe), [], presets=["torch_optim"], callbacks=["StepTimer()"],
                           when=["obj is optimizerX"]) == 1
    err = capsys.readouterr().err
    assert "--when 'obj is optimizerX' (of --callback 'StepTimer()') failed on this call: NameError" in err


def test_a_run_file_holds_the_options_and_the_command_line_adds_to_them(hw, tmp_path):
    """--config run.toml: the dcgan run above from a file (script, preset, callbacks
    with their --when), the same CSV as typed out; a --callback on the command line
    adds to the file's; bad keys and values are refused naming the key and the fix."""
    (tmp_path / "dcgan.py").write_text(textwrap.dedent(_TWO_MODELS))
    (tmp_path / "run.toml").write_text(textwrap.dedent("""
        script = "dcgan.py"
        preset = ["torch_optim"]
        callback = [
            {expr = "GradNorm(model='__main__:netD', event='step', name='grad_norm_D')", when = "obj is optimizerD"},
            {expr = "GradNorm(model='__main__:netG', event='step', name='grad_norm_G')", when = "obj is optimizerG"},
            "MetricsLogger('m.csv', tensorboard=False)",
        ]
    """))
    result = _hookwrap_run(hw, "--config", "run.toml", "--preset", "torch_optim", "--callback", "StepTimer()",
                           cwd=tmp_path)  # the preset the file has too: applied once
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr
    assert "StepTimer: 6 steps" in result.stderr  # the command line's callback, beside the file's
    (tmp_path / "args.py").write_text("import sys\nprint(sys.argv[1:])\n")
    (tmp_path / "args.toml").write_text('script = "args.py"\nargs = ["--a", "1"]\n')
    result = _hookwrap_run(hw, "--config", "args.toml", "--", "--b", "2", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "['--a', '1', '--b', '2']\n", result.stderr
    rows = [line.split(",") for line in (tmp_path / "m.csv").read_text().splitlines()[1:]]
    by_hand = _two_models_norms()
    for name, expected in by_hand.items():
        got = [(int(step), round(float(value), 5)) for step, row_name, value in rows if row_name == name]
        assert got == [(i + 1, round(v, 5)) for i, v in enumerate(expected)]
    for text, message in [
        ("scrip = 'dcgan.py'\n", "--config bad.toml: no option 'scrip'. Did you mean 'script'?"),
        ("preset = [1]\n", "preset must be a list of strings"),
        ("callback = [{expr = 'StepTimer()', whn = 'obj'}]\n", "each callback is a --callback expression"),
        ("args = ['--x']\n", "args are the script's arguments, and no script is named"),
        ("script = \n", "not valid TOML"),
    ]:
        (tmp_path / "bad.toml").write_text(text)
        result = _hookwrap_run(hw, "--config", "bad.toml", "dcgan.py", cwd=tmp_path)
        assert result.returncode == 2 and message in result.stderr and result.stdout == "", result.stderr


def test_a_callback_an_installed_package_registers_is_found_by_its_name(hw, tmp_path):
    """The hookwrap.callbacks entry-point group: a package's callback is named in
    --callback as the shipped ones are, and only the names used are loaded."""
    site = tmp_path / "site"
    (site / "mycallbacks-1.0.dist-info").mkdir(parents=True)
    (site / "mycallbacks-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: mycallbacks\n"
                                                                  "Version: 1.0\n")
    (site / "mycallbacks-1.0.dist-info" / "entry_points.txt").write_text(
        "[hookwrap.callbacks]\nCountSteps = mycallbacks:CountSteps\nBroken = mycallbacks_missing:Broken\n")
    (site / "mycallbacks.py").write_text(textwrap.dedent("""
        import atexit
        import hookwrap as hw

        class CountSteps(hw.Callback):
            calls = 0

            def post_step(self, obj):
                CountSteps.calls += 1

        atexit.register(lambda: print("steps counted:", CountSteps.calls))
    """))
    (tmp_path / "dcgan.py").write_text(textwrap.dedent(_TWO_MODELS))
    env_path = f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = dict(os.environ, PYTHONPATH=env_path, HOOKWRAP_NO_EXTENSIONS="" if hw.USING_EXTENSION else "1")
    result = subprocess.run([sys.executable, "-m", "hookwrap", "run", "--preset", "torch_optim", "--callback",
                             "CountSteps()", "dcgan.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and result.stdout == "done\nsteps counted: 6\n", result.stderr
    result = subprocess.run([sys.executable, "-m", "hookwrap", "run", "--callback", "Broken()", "dcgan.py"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "the hookwrap.callbacks entry point 'Broken' (mycallbacks)" in result.stderr
    assert "No module named 'mycallbacks_missing'" in result.stderr
    result = subprocess.run([sys.executable, "-m", "hookwrap", "run", "--callback", "CountStep()", "dcgan.py"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Did you mean 'CountSteps'" in result.stderr


_MODULE_LEVEL_LOOP = """
    import os, signal, sys
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for it in range(6):
        loss = model(torch.ones(2, 4) * it).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print("iter", it, flush=True)
        if it == 2 and os.environ.get("END") == "signal":
            os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler's preemption
        if it == 2 and os.environ.get("END") == "error":
            raise RuntimeError("the data loader died")
    print("done")
"""


def _weights_after(updates: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for it in range(updates):
        loss = model(torch.ones(2, 4) * it).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.state_dict()


@pytest.mark.parametrize("end, status, saved, updates", [
    ("signal", 143, "signal.pt", 4),  # noted during update 3, saved once the next update completes
    ("error", 1, "exception.pt", 3),  # the run as it was after its last completed update
])
def test_a_module_level_loop_is_the_run_so_signals_and_errors_save(hw, tmp_path, end, status, saved, updates):
    """The script's run is join point ``fit``: Checkpoint(on_signal=..., on_exception=True)
    works on a loop with no function to weave, with model=/optimizer= naming the
    script's globals, made after the run starts."""
    (tmp_path / "loop.py").write_text(textwrap.dedent(_MODULE_LEVEL_LOOP))
    env = dict(os.environ, END=end, HOOKWRAP_NO_EXTENSIONS="" if hw.USING_EXTENSION else "1")
    result = subprocess.run([sys.executable, "-m", "hookwrap", "run", "--preset", "torch_optim", "--callback",
                             "Checkpoint('ck', on_signal='SIGTERM', on_exception=True, model='__main__:model', "
                             "optimizer='__main__:optimizer')", "loop.py"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == status, result.stderr
    assert "done" not in result.stdout
    if end == "signal":  # the job's log says where it can resume from, with no logging set up
        assert f"SIGTERM received; saved the run after step 4 to {tmp_path / 'ck' / 'signal.pt'}" in result.stderr
    checkpoint = torch.load(tmp_path / "ck" / saved, weights_only=True)
    assert checkpoint["step"] == updates
    for name, value in _weights_after(updates).items():
        assert torch.equal(checkpoint["model"][name], value), name
    assert checkpoint["optimizer"]["state"] == {} or checkpoint["optimizer"]["param_groups"][0]["lr"] == 0.1


def test_the_scripts_run_is_no_second_fit_beside_a_weaved_one(hw, tmp_path, capsys):
    """With a fit of the script's own woven, callbacks see that one alone."""
    probe = _script(tmp_path, """
        import torch
        model = torch.nn.Linear(2, 1)
        def fit():
            for _ in range(2):
                model(torch.ones(1, 2)).sum().backward()
        fit()
        fit()
    """)
    seen = []
    assert _runner(hw).run(str(probe), [], weaves=["fit=__main__:fit"],
                           callbacks=[("pre-fit", lambda: seen.append("fit"))]) == 0
    assert seen == ["fit", "fit"]
    seen.clear()
    assert _runner(hw).run(str(probe), [], callbacks=[("pre-fit", lambda: seen.append("script"))]) == 0
    assert seen == ["script"]
    import hookwrap._joinpoints as joinpoints
    import gc
    gc.collect()
    assert not [jp for jp in joinpoints.all_join_points() if "ScriptRun" in getattr(jp, "__qualname__", "")]


def test_state_a_run_reloading_its_own_checkpoint_is_no_resume(hw, tmp_path, capsys):
    """word_language_model saves its best model through an open file and loads it back
    at its end: under --state that is the same run going on, not a resume (nothing
    restored, no row moved), and the saves through a file object are seen."""
    probe = _script(tmp_path, """
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        def evaluate():
            with torch.no_grad():
                return torch.nn.functional.mse_loss(model(torch.ones(2, 4)), torch.zeros(2, 1)).item()
        for it in range(6):
            loss = torch.nn.functional.mse_loss(model(torch.ones(2, 4) * it), torch.zeros(2, 1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if it % 2 == 1:
                evaluate()
                with open("best.pt", "wb") as f:
                    torch.save(model, f)
        with open("best.pt", "rb") as f:
            model = torch.load(f, weights_only=False)
        print("test", evaluate())
    """)
    run = _runner(hw).run
    csvs = []
    for folder, state in (("plain", None), ("state", "st.pt")):
        (tmp_path / folder).mkdir()
        cwd = os.getcwd()
        os.chdir(tmp_path / folder)
        try:
            assert run(str(probe), [], presets=["torch_optim"], state=state,
                       weaves=["evaluate=__main__:evaluate", "loss=torch.nn.functional:mse_loss"],
                       callbacks=["MetricsLogger('m.csv', tensorboard=False)"]) == 0
        finally:
            os.chdir(cwd)
        csvs.append((tmp_path / folder / "m.csv").read_text())
    err = capsys.readouterr().err
    assert "goes on from" not in err and "redoes" not in err
    assert (tmp_path / "state" / "st.pt").is_file()  # written at each save through the open file
    assert not (tmp_path / "state" / "m.before-resume.csv").exists() and csvs[0] == csvs[1]


def test_when_keeps_to_methods_calls_and_leaves_the_runs_start_and_end_to_all(hw, tmp_path):
    """--when 'obj is optimizerD' on a Checkpoint: its saves count optimizerD's updates,
    and the run's start and end (the script's fit, no object) reach it."""
    (tmp_path / "dcgan.py").write_text(textwrap.dedent(_TWO_MODELS))
    result = _hookwrap_run(hw, "--preset", "torch_optim", "--callback",
                           "Checkpoint('ckD', every_n_steps=1, model='__main__:netD', "
                           "optimizer='__main__:optimizerD')", "--when", "obj is optimizerD", "dcgan.py",
                           cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr
    last = torch.load(tmp_path / "ckD" / "last.pt", weights_only=True)
    assert last["step"] == 3  # optimizerD's three updates, not the six of both optimizers


# --- item 5: what the script's source settles is checked before its first line ------

_LOOP = """
    print("started")
    import torch
    model = torch.nn.Linear(2, 1)
    {decorator}
    def train_step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss.item()

    class Trainer:
        def fit(self, steps):
            for _ in range(steps):
                yield train_step(torch.ones(4, 2), torch.zeros(4, 1))

    print(sum(Trainer().fit(3)))
"""


@pytest.mark.parametrize("weaves, callback, message", [
    (["t1_step=__main__:train_step"], ("pre-t1_step", lambda obj, x: None),
     "asks for 'obj', which join point 't1_step' (train_step) does not have. Valid names: x, y."),
    (["t1_step=__main__:train_step"], "NanGuard(events='t1_loss')", "NanGuard: no join point 't1_loss' exists."),
    (["t1_step=__main__:train_step", "t1_run=__main__:Trainer.fit"], ("pre-t1_run", lambda self, epochs: None),
     "asks for 'epochs', which join point 't1_run' (Trainer.fit) does not have. Valid names: steps."),
])
def test_a_callback_that_cannot_run_on_the_scripts_own_function_is_refused_before_its_first_line(
        hw, tmp_path, capsys, weaves, callback, message):
    probe = _script(tmp_path, _LOOP.format(decorator="@torch.no_grad()"))
    assert _runner(hw).run(str(probe), [], weaves=weaves, callbacks=[callback]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # not one line of the script ran
    assert message in captured.err and captured.err.startswith("hookwrap run: ")


def test_callbacks_checked_against_the_source_run_on_the_scripts_functions(hw, tmp_path, capsys):
    """Checked against the stand-ins, registered once: they run on the real
    functions (a generator method, a decorated function) as before, and the
    stand-ins leave no join point behind."""
    from hookwrap._joinpoints import all_join_points

    probe = _script(tmp_path, _LOOP.format(decorator=""))
    seen: list[Any] = []
    before = {id(jp) for jp in all_join_points()}
    status = _runner(hw).run(str(probe), [], weaves=["t2_step=__main__:train_step", "t2_run=__main__:Trainer.fit"],
                             callbacks=[("post-t2_step", lambda return_value: seen.append(round(return_value, 4)) or return_value),
                                        ("pre-t2_run", lambda self, steps: seen.append(("run", steps)) or steps)])
    assert status == 0, capsys.readouterr().err
    assert capsys.readouterr().out.splitlines()[0] == "started"
    assert seen[0] == ("run", 3) and len(seen) == 4
    import gc
    gc.collect()
    assert not [jp for jp in all_join_points() if id(jp) not in before and jp.event in ("t2_step", "t2_run")]


def _refused_once_defined(hw: Any, tmp_path: Path, capsys: Any, decorator: str, event: str, asks: str,
                          callback: Any) -> None:
    """``train_step`` wrapped by the script's own ``decorator`` into ``(*args)``, woven
    as ``event``, and ``callback`` (before it), asking for ``asks``: refused with status
    2 once the script has defined it (after its first line), naming the --callback."""
    probe = _script(tmp_path, _LOOP.format(decorator=f"@{decorator}").replace(
        "model = torch", f"def {decorator}(fn):\n        return lambda *args: fn(*args)\n    model = torch"))
    assert _runner(hw).run(str(probe), [], weaves=[f"{event}=__main__:train_step"],
                           callbacks=[(f"pre-{event}", callback)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "started\n"
    assert captured.err.startswith("hookwrap run: --callback ") and f"asks for '{asks}'" in captured.err


def test_a_decorator_the_source_cannot_see_through_is_checked_once_the_script_defines_it(hw, tmp_path, capsys):
    """A decorator of the script's own may change what the function takes: its
    callbacks are checked when it is defined, the message naming the --callback."""
    _refused_once_defined(hw, tmp_path, capsys, "logged", "t3_step", "x", lambda x: None)


def test_a_stand_in_the_real_function_does_not_match_is_said_when_it_is_defined(hw, tmp_path, capsys):
    """The source says ``train_step(x, y)``; a decorator named like torch's (which
    keeps the signature) turns it into ``(*args)``: a callback that fitted the
    stand-in cannot run on it, said when the script defines it, not skipped."""
    _refused_once_defined(hw, tmp_path, capsys, "no_grad", "t4_step", "y", lambda y: None)


@pytest.mark.third_party
def test_a_module_the_framework_needs_missing_is_said_as_the_framework_is(hw, tmp_path, capsys, monkeypatch):
    """HF's Trainer needs accelerate: the transformers preset without it says so, as
    bad input naming the extra, not a traceback from inside the preset."""
    pytest.importorskip("transformers", reason="needs the thirdparty extra (transformers)")
    for name in [n for n in sys.modules if n == "accelerate" or n.startswith("accelerate.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "accelerate", None)
    assert _runner(hw).run(str(_stepping_script(tmp_path)), [], presets=["transformers"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hookwrap run: --preset 'transformers' needs accelerate, which is not installed here: "
                          "install it (pip install 'hookwrap[transformers]' torch==")
