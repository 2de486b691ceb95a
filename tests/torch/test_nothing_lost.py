"""Nothing lost, never silent (issue 30): every shipped callback that defers
(MetricsLogger's rows, NanGuard's checks, GradNorm's and Throughput's values
logged through a MetricsLogger, ProgressBar's bar) delivers what it was given,
however the run ends (normally, by ``StopTraining``, by another exception, a
script that just ends, the process exiting), whatever the loop looks like (a
hookable class with ``fit``, a class woven by hand with no ``fit``/``epoch``,
plain functions, a module-level script under ``hookwrap run``).
docs/design/decisions.md, "Deferring callbacks settle at boundaries that always come"."""

from __future__ import annotations

import csv
import importlib
import math
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

STEPS = 5
SHAPES = ["fit", "woven", "functions", "script"]
ENDINGS = ["normal", "stop", "error"]


def scripted(model: Any, value: float) -> Any:
    """A loss of exactly ``value`` with a real gradient through ``model``."""
    out = model(torch.ones(4, 2)).mean()
    return out - out.detach() + value


# --- the loop, in each shape ------------------------------------------------------
#
# Each step: loss(value) -> backward(loss), inside step(batch). `losses` scripts the
# values; `end` is what a test callback does at the last step.

LOOP_BODY = """
def loss(value):
    return value

def backward(loss):
    loss.backward()

def step(batch):
    value = loss(scripted(model, next(values)))
    backward(value)
    optimizer.step()
    optimizer.zero_grad()
    return value.detach()
"""


def build(shape: str, hw: Any, tmp_path: Path, losses: list[float]) -> tuple[Any, Callable[[], None], Any]:
    """(what callbacks attach to, run the whole loop, the model)."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.ones(4, 2)
    if shape == "fit":
        class Loop(hw.Hookable):
            def __init__(self) -> None:
                self.model, self.values = model, iter(losses)

            @hw.hookable
            def fit(self) -> None:
                for _ in losses:
                    self.step(batch)

            @hw.hookable
            def step(self, batch: Any) -> Any:
                value = self.loss(scripted(self.model, next(self.values)))
                self.backward(value)
                optimizer.step()
                optimizer.zero_grad()
                return value.detach()

            @hw.hookable
            def loss(self, value: Any) -> Any:
                return value

            @hw.hookable
            def backward(self, loss: Any) -> None:
                loss.backward()

        loop = Loop()
        return loop, loop.fit, model
    if shape == "woven":  # a class nobody edited: its loop `train` is not a join point
        class Trainer:
            def __init__(self) -> None:
                self.model, self.values = model, iter(losses)

            def train(self) -> None:
                for _ in losses:
                    self.step(batch)

            def step(self, batch: Any) -> Any:
                value = self.loss(scripted(self.model, next(self.values)))
                self.backward(value)
                optimizer.step()
                optimizer.zero_grad()
                return value.detach()

            def loss(self, value: Any) -> Any:
                return value

            def backward(self, loss: Any) -> None:
                loss.backward()

        handle = hw.weave(Trainer, "step", "loss", "backward")
        trainer = Trainer()
        build.cleanup.append(handle.remove)  # type: ignore[attr-defined]
        return trainer, trainer.train, model
    if shape == "functions":  # hookable functions of a module, called from a plain loop
        module = types.ModuleType("loop_functions")
        vars(module).update(model=model, optimizer=optimizer, values=iter(losses), scripted=scripted)
        exec(LOOP_BODY, vars(module))
        for name in ("loss", "backward", "step"):
            setattr(module, name, hw.hookable(getattr(module, name)))

        def run() -> None:
            for _ in losses:
                module.step(batch)

        return module, run, model
    raise AssertionError(shape)


build.cleanup = []  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _unweave():
    yield
    while build.cleanup:  # type: ignore[attr-defined]
        build.cleanup.pop()()  # type: ignore[attr-defined]


def attach(hw: Any, target: Any, callbacks: list[Any]) -> list[Any]:
    return [hw.add_callback(target, cb) for cb in callbacks]


def ender(hw: Any, target: Any, end: str) -> None:
    """A test callback ending the run at the last step: StopTraining after its loss
    (as EarlyStopping would), or an error after its backward."""
    count = {"loss": 0, "backward": 0}

    def after_loss(*args: Any) -> None:
        count["loss"] += 1
        if end == "stop" and count["loss"] == STEPS:
            raise hw.StopTraining("stopped at the last step")

    def after_backward(*args: Any) -> None:
        count["backward"] += 1
        if end == "error" and count["backward"] == STEPS:
            raise RuntimeError("the device fell over")

    has_obj = not isinstance(target, types.ModuleType)
    if has_obj:
        hw.after(target, "loss", lambda self: after_loss())
        hw.after(target, "backward", lambda self: after_backward())
    else:
        hw.after(target.loss, "loss", lambda: after_loss())
        hw.after(target.backward, "backward", lambda: after_backward())


def in_boundary(hw: Any, shape: str, run: Callable[[], None]) -> Callable[[], None]:
    """``run``, in a ``boundary()`` block where the loop has no ``fit`` (what a plain
    loop holds arrives at the block's end; without one, at the process's end:
    test_a_plain_loop_that_just_ends_delivers_everything_at_exit)."""
    if shape == "fit":
        return run

    boundary = importlib.import_module("hookwrap.extend").boundary

    def bounded() -> None:
        with boundary():
            run()
    return bounded


def run_to_end(hw: Any, run: Callable[[], None], end: str) -> BaseException | None:
    try:
        run()
    except (hw.StopTraining, RuntimeError) as exc:
        assert end != "normal", exc
        return exc
    assert end == "normal"
    return None


def rows(path: Path) -> dict[str, list[float]]:
    by_name: dict[str, list[float]] = {}
    if path.exists():
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                by_name.setdefault(row["name"], []).append(float(row["value"]))
    return by_name


# --- MetricsLogger, with GradNorm and Throughput logging into it ------------------------


def metric_callbacks(ht: Any, path: Path, model: Any) -> list[Any]:
    logger = ht.MetricsLogger(path, tensorboard=False, loss_event="loss")
    grad_norm = ht.GradNorm(model=model, event="backward", logger=logger)
    throughput = ht.Throughput(every=1, logger=logger, step_event="step")
    return [logger, grad_norm, throughput]


@pytest.mark.parametrize("end", ENDINGS)
@pytest.mark.parametrize("shape", ["fit", "woven", "functions"])
def test_metric_rows_all_arrive_however_the_run_ends(hw, ht, tmp_path, shape, end):
    losses = [float(i + 1) for i in range(STEPS)]
    target, run, model = build(shape, hw, tmp_path, losses)
    path = tmp_path / "m.csv"
    attach(hw, target, metric_callbacks(ht, path, model))
    ender(hw, target, end)
    run_to_end(hw, in_boundary(hw, shape, run), end)
    got = rows(path)
    assert got["loss"] == losses  # every loss computed, the last one too
    backwards = STEPS - (end == "stop")  # a stop after the last loss: no backward
    assert len(got["grad_norm"]) == backwards
    steps_done = STEPS - (end != "normal")  # the last step did not return
    assert len(got["samples_per_sec"]) == steps_done


@pytest.mark.parametrize("end", ENDINGS)
@pytest.mark.parametrize("shape", ["fit", "woven", "functions"])
def test_a_nan_in_the_last_step_is_reported_however_the_run_ends(hw, ht, tmp_path, shape, end):
    losses = [1.0] * (STEPS - 1) + [math.nan]  # fewer checks than check_every, the last one bad
    target, run, _ = build(shape, hw, tmp_path, losses)
    guard = ht.NanGuard(events="loss", check_every=20)
    attach(hw, target, [guard])
    ender(hw, target, end)
    with pytest.raises(BaseException) as raised:
        in_boundary(hw, shape, run)()
    exc = raised.value
    if end == "error":  # the run's own error goes on, the NaN noted on it
        assert isinstance(exc, RuntimeError)
        assert any("NanGuard: before this error" in note and "nan" in note for note in exc.__notes__)
    else:  # it ended normally or by a stop: the NaN ends it instead
        assert isinstance(exc, ht.NonFiniteError), exc
        assert "returned nan" in str(exc) or "was nan" in str(exc)


@pytest.mark.parametrize("end", ENDINGS)
def test_the_progress_bar_closes_with_the_last_loss_however_fit_ends(hw, ht, tmp_path, end):
    import io

    class Loop(hw.Hookable):
        @hw.hookable
        def fit(self) -> None:
            self.epoch()

        @hw.hookable
        def epoch(self) -> None:
            for i in range(STEPS):
                self.step(i)

        @hw.hookable
        def step(self, i: int) -> None:
            self.loss(torch.tensor(float(i + 1)))
            if end == "error" and i == STEPS - 1:
                raise RuntimeError("boom")

        @hw.hookable
        def loss(self, value: Any) -> Any:
            return value

    loop, stream = Loop(), io.StringIO()
    bar = ht.ProgressBar(total=STEPS, file=stream, postfix_every=1, mininterval=0)
    loop.add_callback(bar)
    if end == "stop":
        loop.after("loss", lambda self, return_value: (_ for _ in ()).throw(hw.StopTraining("now"))
                   if float(return_value) == STEPS else return_value)
    try:
        loop.fit()
    except (hw.StopTraining, RuntimeError):
        assert end != "normal"
    assert bar.bar is None  # closed, with the last loss read
    assert f"loss={float(STEPS):.4f}" in stream.getvalue()


# --- a module-level script under `hookwrap run`, and the process exiting -------------------

SCRIPT = """
import math, sys, torch

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
values = iter([float(v) for v in sys.argv[2].split(",")])

def scripted(model, value):
    out = model(torch.ones(4, 2)).mean()
    return out - out.detach() + value
""" + LOOP_BODY + """
for i in range({steps}):
    print("loss", float(step(torch.ones(4, 2))))
    if sys.argv[1] == "exit" and i == {steps} - 1:
        sys.exit(3)
    if sys.argv[1] == "error" and i == {steps} - 1:
        raise RuntimeError("the device fell over")
"""


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(steps=STEPS))
    return script


@pytest.mark.parametrize("end", ["normal", "error"])
def test_a_script_under_hookwrap_run_logs_every_loss_it_prints(hw, tmp_path, capsys, end):
    runner = importlib.import_module("hookwrap._script_runner")
    csv_path = tmp_path / "m.csv"
    losses = [0.5 * (i + 1) for i in range(STEPS)]
    status = runner.run(str(_script(tmp_path)), [end, ",".join(map(str, losses))],
                        weaves=["__main__:loss", "__main__:step"],
                        callbacks=[f"MetricsLogger({str(csv_path)!r}, tensorboard=False)"])
    printed = [float(line.split()[1]) for line in capsys.readouterr().out.splitlines() if line.startswith("loss")]
    assert status == (0 if end == "normal" else 1)
    assert printed == losses and rows(csv_path)["loss"] == printed


def test_a_script_under_hookwrap_run_reports_a_nan_in_its_last_step(hw, tmp_path, capsys):
    runner = importlib.import_module("hookwrap._script_runner")
    losses = [1.0] * (STEPS - 1) + [math.nan]
    status = runner.run(str(_script(tmp_path)), ["normal", ",".join(map(str, losses))],
                        weaves=["__main__:loss", "__main__:step"], callbacks=["NanGuard(events='loss')"])
    assert status == 1
    assert f"NonFiniteError: NanGuard: event 'post-loss' returned nan" in capsys.readouterr().err


def test_the_process_exiting_delivers_what_is_held(hw, tmp_path):
    """``sys.exit`` inside a loop with no ``fit``: what its logger and a logger
    nothing settles (only logged into, never attached) hold is delivered at
    interpreter exit, said on stderr, with the status the program chose."""
    script = tmp_path / "exits.py"
    csv_path, direct_path = tmp_path / "m.csv", tmp_path / "direct.csv"
    script.write_text(textwrap.dedent(f"""
        import sys, torch, hookwrap as hw
        from hookwrap.torch import MetricsLogger

        class Loop(hw.Hookable):
            @hw.hookable
            def train(self):
                for i in range({STEPS}):
                    self.loss(torch.tensor(float(i + 1)))
                    direct.log("lr", torch.tensor(0.5), step=i)  # as LRMonitor(logger=direct) would
                sys.exit(3)  # inside train: its end never comes

            @hw.hookable
            def loss(self, value):
                return value

        direct = MetricsLogger({str(direct_path)!r}, tensorboard=False)
        loop = Loop()
        loop.add_callback(MetricsLogger({str(csv_path)!r}, tensorboard=False))
        loop.train()
    """))
    env = dict(os.environ, HOOKWRAP_NO_EXTENSIONS="" if hw.USING_EXTENSION else "1")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 3, done.stderr
    assert rows(csv_path)["loss"] == [float(i + 1) for i in range(STEPS)]
    assert rows(direct_path)["lr"] == [0.5] * STEPS
    assert "at interpreter exit" in done.stderr and f"still held {STEPS} metric rows, delivered now" in done.stderr


# --- a stop lets the other callbacks of its event run first --------------------------


@pytest.mark.parametrize("path", ["fast", "general"])
def test_a_stop_runs_the_events_other_callbacks_first_in_any_order(hw, path):
    """docs/design/decisions.md: what is saved or logged does not depend on the order
    callbacks were attached in. ``general``: an error callback puts the chain on the
    general path (``_rules.run_steps``); ``fast`` is the compiled or generated runner."""
    seen: list[str] = []

    class Loop(hw.Hookable):
        @hw.hookable
        def evaluate(self, score: float) -> float:
            return score

    loop = Loop()

    def stop_pre(self: Any, score: float) -> float:
        seen.append("stop-pre")
        raise hw.StopTraining("pre")

    loop.before("evaluate", stop_pre)
    loop.before("evaluate", lambda self, score: seen.append("pre") and None or score)
    loop.after("evaluate", lambda self, return_value: seen.append("post") and None or return_value)
    if path == "general":
        loop.on_error("evaluate", lambda self: None)
    with pytest.raises(hw.StopTraining, match="pre"):
        loop.evaluate(1.0)
    assert seen == ["stop-pre", "pre"]  # the other pre callback ran; the function did not

    seen.clear()
    loop2 = Loop()
    stops = []

    def stopper(self: Any, return_value: float) -> float:
        stops.append(return_value)
        raise hw.StopTraining(f"first {len(stops)}")

    loop2.after("evaluate", stopper)
    loop2.after("evaluate", lambda self, return_value: seen.append(f"log {return_value}") and None or return_value)
    loop2.after("evaluate", stopper)  # a second stop: the first is the one raised
    if path == "general":
        loop2.on_error("evaluate", lambda self: None)
    with pytest.raises(hw.StopTraining, match="first 1") as raised:
        loop2.evaluate(2.0)
    assert seen == ["log 2.0"] and stops == [2.0, 2.0]
    assert any("stopper" in note for note in raised.value.__notes__)


def test_a_stop_in_a_custom_event_lets_the_other_listeners_run(hw):
    heard: list[str] = []

    class Fabric(hw.Hookable):
        emits = ("on_validation_end",)

    fabric = Fabric()

    def stop(self: Any, metrics: dict[str, float]) -> None:
        raise hw.StopTraining("enough")

    fabric.on("on_validation_end", stop)
    fabric.on("on_validation_end", lambda self, metrics: heard.append(str(metrics)) and None)
    with pytest.raises(hw.StopTraining, match="enough"):
        fabric.emit("on_validation_end", metrics={"val_loss": 1.0})
    assert heard == ["{'val_loss': 1.0}"]


def test_a_stop_on_an_async_join_point_lets_the_other_callbacks_run(hw):
    import asyncio

    heard: list[float] = []

    class Loop(hw.Hookable):
        @hw.hookable
        async def evaluate(self) -> float:
            return 0.5

    loop = Loop()

    def stop(self: Any, return_value: float) -> float:
        raise hw.StopTraining("enough")

    loop.after("evaluate", stop)
    loop.after("evaluate", lambda self, return_value: heard.append(return_value) and None or return_value)
    with pytest.raises(hw.StopTraining):
        asyncio.run(loop.evaluate())
    assert heard == [0.5]


@pytest.mark.parametrize("first", ["early_stopping", "others"])
def test_early_stopping_attached_first_costs_the_best_checkpoint_and_the_log_nothing(hw, ht, tmp_path, first):
    """The issue's run: EarlyStopping stops on the evaluation that is also the best;
    BestCheckpoint saves it and MetricsLogger logs it whichever was attached first."""
    scores = [3.3, 3.1933, 3.25, 3.1506]  # patience 2 (min_delta 0.05): stops on the 4th, the best

    class Loop(hw.Hookable):
        def __init__(self) -> None:
            self.model = torch.nn.Linear(2, 1)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

        @hw.hookable
        def fit(self) -> None:
            try:
                for score in scores:
                    self.evaluate(score)
            except hw.StopTraining:
                pass

        @hw.hookable
        def evaluate(self, score: float) -> dict[str, float]:
            return {"val_loss": score}

    loop = Loop()
    stopper = ht.EarlyStopping("val_loss", patience=2, min_delta=0.05)
    best = ht.BestCheckpoint(tmp_path / "best.pt", monitor="val_loss")
    logger = ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False)
    order = [stopper, best, logger] if first == "early_stopping" else [best, logger, stopper]
    for cb in order:
        loop.add_callback(cb)
    loop.fit()
    assert best.best.value == pytest.approx(3.1506)
    assert rows(tmp_path / "m.csv")["val_loss"] == scores


# --- refused where it can never work; what the lifecycle shows -------------------------


def test_metrics_logger_on_a_target_with_nothing_to_log_is_refused(hw, ht, tmp_path):
    class OnlyFit(hw.Hookable):
        @hw.hookable
        def fit(self) -> None:
            pass

    with pytest.raises(hw.HookError, match="none of the join points it logs.*loss_event='loss'"):
        OnlyFit().add_callback(ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False))


def test_a_metric_that_is_not_one_number_is_left_out_once_said_and_the_run_goes_on(hw, ht, tmp_path):
    """A logger is a side job: a confusion matrix beside the accuracy is said once
    (naming its key and the fix) and left out; the rest is logged, the run goes on."""
    class Loop(hw.Hookable):
        @hw.hookable
        def fit(self) -> None:
            for value in (0.5, 0.75):
                self.evaluate(value)

        @hw.hookable
        def evaluate(self, value: float) -> dict[str, Any]:
            return {"accuracy": torch.tensor(value), "confusion": torch.eye(2)}

    loop = Loop()
    loop.add_callback(ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False))
    with pytest.warns(hw.HookwrapWarning, match=r"the metric 'confusion' at step 0 is a tensor of shape "
                                                r"\(2, 2\), not one number.*left out") as said:
        loop.fit()
    assert sum("confusion" in str(w.message) for w in said) == 1  # once, not at each evaluation
    got = rows(tmp_path / "m.csv")
    assert got["accuracy"] == [0.5, 0.75] and "confusion" not in got


def test_callback_state_settles_the_checks_still_queued(hw, ht):
    """A manual save mid-run (the resuming guide's) would drop a queued NaN check
    with the process; it is decided when the state is taken."""
    from hookwrap.extend import boundary

    class Loop(hw.Hookable):
        @hw.hookable
        def loss(self, value: Any) -> Any:
            return value

    loop = Loop()
    loop.add_callback(ht.NanGuard(events="loss"))
    with boundary():  # calls that defer (a script's)
        loop.loss(torch.tensor(1.0))
        loop.loss(torch.tensor(math.nan))
        with pytest.raises(ht.NonFiniteError, match="returned nan"):
            hw.callback_state(loop)


def test_describe_shows_where_a_deferring_callback_settles(hw, ht, tmp_path):
    target, _, model = build("woven", hw, tmp_path, [1.0])
    hw.add_callback(target, ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False, loss_event="loss"))
    assert "settle" not in str(hw.describe(target, "step"))  # no fit: nothing per call (read at its own points)

    fit_loop, _, _ = build("fit", hw, tmp_path, [1.0])
    fit_loop.add_callback(ht.MetricsLogger(tmp_path / "n.csv", tensorboard=False))
    assert "settle_at_run_end" in str(hw.describe(fit_loop, "fit"))
    assert "settle" not in str(hw.describe(fit_loop, "step"))  # nothing added per step


def test_a_shipped_callback_with_none_of_its_join_points_is_refused(hw, ht, tmp_path):
    class OnlyForward(hw.Hookable):
        @hw.hookable
        def forward(self, x: Any) -> Any:
            return x

    with pytest.raises(hw.HookError, match=r"OnlyForward has none of the join points it runs on "
                                           r"\(.*epoch_event='epoch'.*\), so it would never run"):
        OnlyForward().add_callback(ht.Checkpoint(tmp_path / "ckpt"))


# --- a preset: ignite's Engine (third party) --------------------------------------------


@pytest.mark.third_party
@pytest.mark.parametrize("end", ENDINGS)
def test_on_the_ignite_preset_every_row_and_the_last_nan_arrive(hw, ht, tmp_path, end):
    engine_module = pytest.importorskip("ignite.engine", reason="needs the thirdparty extra (pytorch-ignite)")
    preset = importlib.import_module("hookwrap.integrations.ignite")
    values = [float(i + 1) for i in range(STEPS - 1)] + [math.nan]
    with preset.weave():
        engine = engine_module.Engine(lambda engine, batch: torch.tensor(values[engine.state.iteration - 1]))
        logger = ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False, loss_event="step")
        hw.add_callback(engine, logger)
        hw.add_callback(engine, ht.NanGuard(events="step"))

        def at_the_last(self: Any, return_value: Any) -> Any:
            if self.state.iteration == STEPS and end == "stop":
                raise hw.StopTraining("enough")  # the preset turns it into engine.terminate()
            if self.state.iteration == STEPS and end == "error":
                raise RuntimeError("the device fell over")
            return return_value

        hw.after(engine, "step", at_the_last)
        with pytest.raises(BaseException) as raised:
            engine.run([0] * STEPS, max_epochs=1)
    logged = rows(tmp_path / "m.csv")["loss"]
    assert logged[:-1] == values[:-1] and math.isnan(logged[-1])  # every step's row, the NaN's too
    if end == "error":
        assert isinstance(raised.value, RuntimeError)
        assert any("NanGuard: before this error" in note for note in raised.value.__notes__)
    else:
        assert isinstance(raised.value, ht.NonFiniteError), raised.value
        assert f"returned nan at step {STEPS}" in str(raised.value)


# --- from the new-user trial on nanoGPT and minGPT -------------------------------------


def test_nan_guard_checks_each_element_of_a_returned_tuple(hw, ht, tmp_path):
    """nanoGPT's ``GPT.forward`` returns ``(logits, loss)``: a tuple was skipped,
    unchecked, and a NaN run exited 0."""

    class Model(hw.Hookable):
        @hw.hookable
        def fit(self, losses: list[float]) -> None:
            for value in losses:
                self.forward(value)

        @hw.hookable
        def forward(self, value: float) -> tuple[Any, Any]:
            return torch.zeros(2, 3), torch.tensor(value)

    for sync in (False, True):
        model = Model()
        model.add_callback(ht.NanGuard(events="forward", sync=sync))
        with pytest.raises(ht.NonFiniteError, match=r"returned nan\[1\] before any step was counted"):
            model.fit([1.0, math.nan])


def test_metrics_logger_given_a_tuple_loss_names_the_fix(hw, ht, tmp_path):
    class Model(hw.Hookable):
        @hw.hookable
        def loss(self) -> Any:
            return torch.zeros(2, 3), torch.tensor(1.0)

    model = Model()
    model.add_callback(ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False))
    with pytest.warns(hw.HookwrapWarning, match=r"returned a tuple of 2 \(Tensor, Tensor\), not one loss.*"
                                                r"--weave loss=torch.nn.functional:cross_entropy"):
        model.loss()
    assert model.loss()[1] == 1.0  # the run goes on (said once)


def test_a_keyboard_interrupt_leaving_fit_writes_what_was_held(hw, ht, tmp_path, capsys):
    """Ctrl-C caught by the script: the rows held were lost until the kernel exited."""
    target, run, model = build("fit", hw, tmp_path, [1.0, 2.0, math.nan])
    target.add_callback(ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False))
    target.add_callback(ht.NanGuard())
    hw.after(target, "loss", lambda self, return_value: (_ for _ in ()).throw(KeyboardInterrupt())
             if math.isnan(float(return_value)) else return_value)
    with pytest.raises(KeyboardInterrupt):
        run()
    logged = rows(tmp_path / "m.csv")["loss"]
    assert logged[:2] == [1.0, 2.0] and math.isnan(logged[2])
    assert "NanGuard: before this error, event 'post-loss' returned nan" in capsys.readouterr().err


def test_sys_exit_0_inside_fit_with_a_nan_pending_reports_it(hw, ht, tmp_path):
    target, run, model = build("fit", hw, tmp_path, [1.0, math.nan, 1.0])
    target.add_callback(ht.NanGuard())
    hw.after(target, "step", lambda self, return_value: sys.exit(0) if float(return_value) == 1.0
             and target.step_count == 3 else return_value)
    target.step_count = 0
    hw.before(target, "step", lambda self: setattr(self, "step_count", self.step_count + 1))
    with pytest.raises(ht.NonFiniteError, match="returned nan"):
        run()  # the exit status is the NaN's (1), not sys.exit(0)'s


def test_metrics_logger_writes_what_was_read_every_flush_secs(hw, ht, tmp_path, monkeypatch):
    """A long run with no epoch or fit: its CSV is followed as it grows, and a kill
    loses at most ``flush_secs`` of rows."""
    metrics_logger = importlib.import_module("hookwrap.torch.metrics_logger")
    now = [0.0]
    monkeypatch.setattr(metrics_logger, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    logger = ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False, flush_secs=5.0)
    from hookwrap.extend import boundary

    with boundary():  # a script's: nothing settles before its end
        for second in range(12):
            now[0] = float(second)
            logger.log("loss", torch.tensor(float(second)), step=second)
        written = rows(tmp_path / "m.csv")["loss"]
        assert written == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]  # at 5 s and 10 s, all but the last step's
    assert rows(tmp_path / "m.csv")["loss"] == [float(s) for s in range(12)]
    with pytest.raises(hw.HookError, match="flush_secs must be a number > 0"):
        ht.MetricsLogger(tmp_path / "m.csv", flush_secs=0)


# --- from the adversarial review ----------------------------------------------------


def test_an_async_fit_is_still_a_boundary(hw, ht, tmp_path):
    import asyncio

    class Loop(hw.Hookable):
        @hw.hookable
        def loss(self, value: float) -> Any:
            return torch.tensor(value)

        @hw.hookable
        async def fit(self, values: list[float]) -> None:
            for value in values:
                self.loss(value)

    loop = Loop()
    loop.add_callback(ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False))
    asyncio.run(loop.fit([1.0, 2.0, 3.0]))
    assert rows(tmp_path / "m.csv")["loss"] == [1.0, 2.0, 3.0]
    loop.add_callback(ht.NanGuard())
    with pytest.raises(ht.NonFiniteError, match="returned nan"):
        asyncio.run(loop.fit([1.0, math.nan, 1.0]))


def test_overlapping_calls_from_two_threads_leave_the_boundary_working(hw, ht):
    import threading
    import time

    class Model(hw.Hookable):
        @hw.hookable
        def fit(self, value: float, wait: float = 0.0) -> Any:
            time.sleep(wait)
            return self.loss(value)

        @hw.hookable
        def loss(self, value: float) -> Any:
            return torch.tensor(value)

    model, guard = Model(), ht.NanGuard()
    model.add_callback(guard)
    first = threading.Thread(target=model.fit, args=(1.0, 0.2))
    second = threading.Thread(target=model.fit, args=(1.0, 0.4))
    first.start()
    time.sleep(0.05)
    second.start()
    first.join()
    second.join()
    with pytest.raises(ht.NonFiniteError, match="returned nan"):
        model.fit(math.nan)


def test_one_guard_on_two_objects_decides_at_the_end_of_fit(hw, ht):
    from hookwrap.extend import boundary

    class Helper(hw.Hookable):
        @hw.hookable
        def loss(self, value: float) -> Any:
            return torch.tensor(value)

    class Trainer(hw.Hookable):
        def __init__(self) -> None:
            self.helper = Helper()

        @hw.hookable
        def fit(self) -> None:
            self.loss(math.nan)
            self.helper.loss(1.0)  # the same guard's last check is the helper's

        @hw.hookable
        def loss(self, value: float) -> Any:
            return torch.tensor(value)

    trainer, guard = Trainer(), ht.NanGuard()
    trainer.add_callback(guard)
    trainer.helper.add_callback(guard)
    with boundary(), pytest.raises(ht.NonFiniteError, match=r"returned nan .*\(Trainer\)"):
        trainer.fit()


def test_a_global_guard_is_not_narrowed_by_an_unrelated_classs_fit(hw, ht):
    class SomeOtherTrainer(hw.Hookable):
        @hw.hookable
        def fit(self) -> None:
            pass

    class Model(hw.Hookable):
        @hw.hookable
        def loss(self, value: float) -> Any:
            return torch.tensor(value)

    with pytest.raises(ht.NonFiniteError, match="returned nan"), ht.NanGuard():
        Model().loss(math.nan)  # no fit of its own: decided when the guard is removed
    assert SomeOtherTrainer


def test_a_logger_removed_mid_run_writes_what_it_held(hw, ht, tmp_path):
    from hookwrap.extend import boundary

    target, _, _ = build("fit", hw, tmp_path, [1.0])
    with boundary():
        handle = target.add_callback(ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False))
        for value in (1.0, 2.0, 3.0):
            target.loss(torch.tensor(value))
        handle.remove()
        assert rows(tmp_path / "m.csv")["loss"] == [1.0, 2.0, 3.0]


def test_a_copied_deferring_callback_is_settled_too(hw, ht, tmp_path):
    import copy

    from hookwrap import _callback

    guard = ht.NanGuard()
    target, _, _ = build("fit", hw, tmp_path, [1.0])
    target.add_callback(guard)
    guard._depth[(0, 0)] = 1  # a call in flight in this process
    twin = copy.deepcopy(guard)
    assert any(cb is twin for cb in _callback.deferring_callbacks())  # settled at exit too
    assert twin._depth == {}  # the original's calls in flight are not the copy's


@pytest.mark.parametrize("phase", ["before", "after"])
@pytest.mark.parametrize("path", ["fast", "general"])
def test_an_error_after_a_stop_keeps_the_stop_as_its_context(hw, phase, path):
    class Loop(hw.Hookable):
        @hw.hookable
        def step(self, x: int) -> int:
            return x

    def stop(self: Any) -> None:
        raise hw.StopTraining("s")

    def boom(self: Any) -> None:
        raise ValueError("boom")

    loop = Loop()
    getattr(loop, phase)("step", stop)
    getattr(loop, phase)("step", boom)
    if path == "general":
        loop.on_error("step", lambda self, exception: None)
    with pytest.raises(ValueError) as raised:
        loop.step(1)
    assert isinstance(raised.value.__context__, hw.StopTraining)


def test_a_pending_check_keeps_no_trainer_alive(hw, ht):
    import gc
    import weakref

    from hookwrap.extend import boundary

    class Trainer(hw.Hookable):
        @hw.hookable
        def loss(self, value: float) -> Any:
            return torch.tensor(value)

    guard = ht.NanGuard()
    with boundary():
        trainer = Trainer()
        trainer.add_callback(guard)
        trainer.loss(1.0)
        alive = weakref.ref(trainer)
        del trainer
        gc.collect()
        assert alive() is None


@pytest.mark.parametrize("first", ["logger", "guard"])
def test_a_run_a_nan_ends_is_failed_for_every_logger_whatever_the_order(hw, ht, first):
    class Sink:
        def __init__(self) -> None:
            self.statuses: list[str] = []

        def log_metrics(self, metrics: dict[str, float], step: int) -> None:
            pass

        def finalize(self, status: str) -> None:
            self.statuses.append(status)

    class Loop(hw.Hookable):
        @hw.hookable
        def loss(self, value: float) -> Any:
            return torch.tensor(value)

        @hw.hookable
        def fit(self) -> None:
            for value in (1.0, math.nan, 1.0):
                self.loss(value)

    sink, loop = Sink(), Loop()
    callbacks = [ht.MetricsLogger(loggers=[sink]), ht.NanGuard()]
    for cb in callbacks if first == "logger" else callbacks[::-1]:
        loop.add_callback(cb)
    with pytest.raises(ht.NonFiniteError):
        loop.fit()
    assert sink.statuses == ["failed"]
