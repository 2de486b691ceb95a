"""MetricsLogger's loggers (issue 24, point 1): any object with
``log_metrics(metrics, step)`` gets the values read back in batches, one dict per
step, in step order; none is read back per step, none is lost when a logger fails.

Lightning's, W&B's and MLflow's loggers: tests/torch/test_loggers_thirdparty.py."""

from __future__ import annotations

import copy
import pickle
import re
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra")
pytest.importorskip("tqdm", reason="needs the torch extra (tqdm)")


class Recorder:
    """A logger of the user's own: the protocol, and the optional save/finalize."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, dict[str, float]]] = []
        self.saves = 0
        self.finalized: list[str] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.calls.append((step, metrics))

    def save(self) -> None:
        self.saves += 1

    def finalize(self, status: str) -> None:
        self.finalized.append(status)


class OnlyLogs:
    def __init__(self) -> None:
        self.calls: list[tuple[int, dict[str, float]]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.calls.append((step, metrics))


class Broken:
    def __init__(self, at_step: int | None = None, in_finalize: bool = False) -> None:
        self.at_step, self.in_finalize = at_step, in_finalize

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if step == self.at_step:
            raise OSError("disk full")

    def finalize(self, status: str) -> None:
        if self.in_finalize:
            raise OSError(f"cannot finalize ({status})")


def _data(steps: int) -> list[tuple[Any, Any]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g)) for _ in range(steps)]


def make_loop(hw: Any, steps_per_epoch: int = 3, fail_at: int | None = None) -> Any:
    class Loop(hw.Hookable):
        def __init__(self) -> None:
            torch.manual_seed(0)
            self.model = torch.nn.Linear(3, 1)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            self.batches = _data(steps_per_epoch)
            self.steps = 0

        @hw.hookable
        def fit(self, epochs: int) -> None:
            for index in range(epochs):
                self.epoch(index)
                self.evaluate(index)

        @hw.hookable
        def epoch(self, index: int) -> None:
            for batch in self.batches:
                self.step(batch)

        @hw.hookable
        def step(self, batch: Any) -> None:
            self.steps += 1
            if self.steps == fail_at:
                raise RuntimeError("the data loader died")
            self.loss(batch).backward()
            self.optimizer.step()
            self.optimizer.zero_grad()

        @hw.hookable
        def loss(self, batch: Any) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.model(x), y)

        @hw.hookable
        def evaluate(self, index: int) -> dict[str, float]:
            return {"val_loss": 1.0 / (index + 1)}

    return Loop()


def losses_by_hand(steps_per_epoch: int, epochs: int) -> list[float]:
    """The same loop written out in plain torch, each loss read with .item()."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = _data(steps_per_epoch)
    losses = []
    for _ in range(epochs):
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x), y)
            losses.append(loss.item())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return losses


def test_a_logger_of_your_own_gets_each_step_once_in_order_at_each_flush(hw, ht):
    loop = make_loop(hw)
    mine, plain = Recorder(), OnlyLogs()
    logger = ht.MetricsLogger(loggers=[mine, plain])
    loop.add_callback(logger)
    seen_after_each_step: list[int] = []
    loop.after("step", lambda self: seen_after_each_step.append(len(mine.calls)))
    loop.fit(2)
    losses = losses_by_hand(3, 2)
    assert mine.calls == [
        (1, {"loss": losses[0]}), (2, {"loss": losses[1]}), (3, {"loss": losses[2]}),  # epoch 1's flush
        (3, {"val_loss": 1.0}),  # evaluated after that flush: a call of its own for step 3
        (4, {"loss": losses[3]}), (5, {"loss": losses[4]}), (6, {"loss": losses[5]}),
        (6, {"val_loss": 0.5}),  # at the end of fit
    ]
    assert plain.calls == mine.calls
    assert all(type(value) is float for _, metrics in mine.calls for value in metrics.values())
    assert seen_after_each_step == [0, 0, 0, 3, 3, 3]  # sent when an epoch ends, not per step
    assert mine.saves == 3 and mine.finalized == ["success"]  # save per batch, finalize at the end


def test_step_from_numbers_every_row_by_the_loops_own_counter(hw, ht):
    """``step_from``: a loop that numbers its iterations from 100 (a resumed run's own
    counter) gets its rows there, the values unchanged; a setting or a value that is no
    step number is refused naming it."""
    loop = make_loop(hw)
    loop.iteration = 100
    loop.after("step", lambda self: setattr(self, "iteration", self.iteration + 1))
    mine = Recorder()
    loop.add_callback(ht.MetricsLogger(loggers=[mine], step_from=lambda: torch.tensor(loop.iteration)))
    loop.fit(1)
    losses = losses_by_hand(3, 1)
    assert mine.calls[:3] == [(100, {"loss": losses[0]}), (101, {"loss": losses[1]}), (102, {"loss": losses[2]})]
    with pytest.raises(hw.SettingError, match=r"step_from must be a function returning the loop's own step"):
        ht.MetricsLogger(loggers=[mine], step_from=5)
    loop = make_loop(hw)
    loop.add_callback(ht.MetricsLogger(loggers=[Recorder()], step_from=lambda: "three"))
    with pytest.raises(hw.SettingError, match=r"step_from returned 'three' \(str\), not a whole number"):
        loop.fit(1)

def test_wide_writes_a_column_per_name_beside_the_long_file(hw, ht, tmp_path):
    """``wide=True``: at the end of fit, ``m.wide.csv`` holds step, loss and val_loss
    columns, a row per step (the evaluation in its step's row), the values of the long
    file; a name logged twice in a step starts another row."""
    import csv

    loop = make_loop(hw)
    logger = ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False, wide=True)
    loop.add_callback(logger)
    loop.fit(2)
    logger.log("loss", 0.5, step=6)  # a second loss at step 6: a row of its own
    logger.close()
    with open(tmp_path / "m.wide.csv", newline="") as f:
        table = list(csv.DictReader(f))
    losses = losses_by_hand(3, 2)
    assert list(table[0]) == ["step", "loss", "val_loss"]
    assert [(int(r["step"]), float(r["loss"])) for r in table[:6]] == list(zip(range(1, 7), losses))
    assert [r["val_loss"] for r in table] == ["", "", "1.0", "", "", "0.5", ""]
    assert table[6] == {"step": "6", "loss": "0.5", "val_loss": ""}
    with pytest.raises(hw.SettingError, match=r"wide=True writes a wide copy of the CSV file, and there is none"):
        ht.MetricsLogger(loggers=[Recorder()], wide=True)

def test_logging_a_tensor_loss_every_step_reads_nothing_back_per_step(hw, ht):
    loop = make_loop(hw, steps_per_epoch=20)
    mine = Recorder()
    loop.add_callback(ht.MetricsLogger(loggers=[mine]))
    batch = loop.batches[0]
    with ht.count_host_reads() as reads:
        for _ in range(20):  # the hot path: steps, no epoch end
            loop.step(batch)
    assert reads.count == 0 and mine.calls == []
    loop = make_loop(hw, steps_per_epoch=20)
    mine = Recorder()
    loop.add_callback(ht.MetricsLogger(loggers=[mine]))
    with ht.count_host_reads() as reads:
        loop.fit(3)  # 60 steps, 60 tensor losses
    assert reads.count == 3, reads  # one read per epoch, for all of them
    assert [metrics["loss"] for _, metrics in mine.calls if "loss" in metrics] == losses_by_hand(20, 3)


def test_csv_path_and_loggers_together_get_the_same_values(hw, ht, tmp_path):
    loop = make_loop(hw)
    mine = Recorder()
    logger = ht.MetricsLogger(tmp_path / "m.csv", loggers=mine, tensorboard=False)  # one logger, no list
    loop.add_callback(logger)
    loop.fit(2)
    rows = logger.read()
    assert rows == [(step, name, value) for step, metrics in mine.calls for name, value in metrics.items()]
    assert [type(s).__name__ for s in logger.sinks] == ["CSVWriter", "Recorder"]


def test_a_name_logged_twice_in_a_step_is_a_second_call_and_rows_go_by_step(hw, ht):
    mine = Recorder()
    logger = ht.MetricsLogger(loggers=[mine])
    for step, name, value in [(2, "a", 1.0), (1, "a", 2.0), (2, "b", 3.0), (2, "a", 4.0)]:
        logger.log(name, value, step)
    logger.flush()
    assert mine.calls == [(1, {"a": 2.0}), (2, {"a": 1.0, "b": 3.0}), (2, {"a": 4.0})]


def test_rows_are_sent_once_max_rows_wait_but_not_the_current_step(hw, ht, monkeypatch):
    monkeypatch.setattr(ht.MetricsLogger, "max_rows", 4)
    mine = Recorder()
    logger = ht.MetricsLogger(loggers=[mine])
    for step in range(1, 9):
        logger.step = step
        logger.log("loss", float(step))
        logger.log("lr", 0.1)
    assert [step for step, _ in mine.calls] == [1, 2, 3, 4, 5, 6, 7]
    assert mine.calls[0] == (1, {"loss": 1.0, "lr": 0.1})
    logger.close()
    assert [step for step, _ in mine.calls][-1] == 8 and mine.finalized == ["success"]


def test_a_logger_that_raises_does_not_cost_the_others_their_values(hw, ht):
    loop = make_loop(hw)
    mine = Recorder()
    loop.add_callback(ht.MetricsLogger(loggers=[Broken(at_step=2), mine]))
    with pytest.raises(OSError, match="disk full") as info:
        loop.fit(1)
    assert [step for step, _ in mine.calls] == [1, 2, 3]  # the other logger got the whole batch
    assert ("MetricsLogger: Broken.log_metrics raised at step 2; it missed the values of steps 2-3, "
            "which the other loggers got.") in info.value.__notes__
    assert mine.finalized == ["failed"]  # the error ended fit


def test_a_logger_failing_to_finalize_a_failed_fit_is_noted_on_its_error(hw, ht):
    loop = make_loop(hw, fail_at=2)
    mine = Recorder()
    loop.add_callback(ht.MetricsLogger(loggers=[Broken(in_finalize=True), mine]))
    with pytest.raises(RuntimeError, match="the data loader died") as info:
        loop.fit(1)
    assert ("MetricsLogger: Broken.finalize('failed') raised. (OSError: cannot finalize (failed))"
            in info.value.__notes__)
    assert [step for step, _ in mine.calls] == [1] and mine.finalized == ["failed"]


def test_a_logger_failing_to_finalize_after_a_good_fit_raises(hw, ht):
    loop = make_loop(hw)
    mine = Recorder()
    loop.add_callback(ht.MetricsLogger(loggers=[Broken(in_finalize=True), mine]))
    with pytest.raises(OSError, match=re.escape("cannot finalize (success)")) as info:
        loop.fit(1)
    assert "MetricsLogger: Broken.finalize('success') raised." in info.value.__notes__
    assert mine.finalized[0] == "success"


@pytest.mark.parametrize("make, message", [
    (lambda ht: ht.MetricsLogger(), "MetricsLogger: nothing to log to. Pass path= (a CSV file) and/or loggers="),
    (lambda ht: ht.MetricsLogger(loggers=[]), "MetricsLogger: nothing to log to."),
    (lambda ht: ht.MetricsLogger(loggers=["runs/m.csv"]),
     "MetricsLogger: loggers[0], 'runs/m.csv' (str), has no log_metrics method. A logger is an object with "
     "log_metrics(metrics: dict[str, float], step: int), as Lightning's loggers"),
    (lambda ht: ht.MetricsLogger(loggers=[Recorder(), object()]), "loggers[1], <object object at"),
    (lambda ht: ht.MetricsLogger(loggers=[type("Odd", (), {"log_metrics": 3})()]),
     "(Odd), has a log_metrics that is not callable (a int)"),
    (lambda ht: ht.MetricsLogger(loggers=5), "MetricsLogger: loggers must be a list of loggers"),
    (lambda ht: ht.MetricsLogger(loggers=[Recorder]),
     "MetricsLogger: loggers[0] is the class Recorder, not a logger: pass an instance, Recorder(...)."),
    (lambda ht: ht.MetricsLogger(loggers=Recorder), "loggers[0] is the class Recorder"),
    (lambda ht: ht.MetricsLogger(Recorder()), "MetricsLogger: path is hookwrap's own CSV file, and Recorder "
                                             "is a logger: pass it as loggers=[...]"),
    (lambda ht: ht.MetricsLogger(loggers=[Recorder()], tensorboard=True),
     "tensorboard=True writes beside the CSV file, and there is none"),
    (lambda ht: ht.MetricsLogger(loggers=[Recorder()]).read(), "MetricsLogger.read() parses the CSV file"),
])
def test_bad_loggers_are_refused_when_built_naming_them_and_the_fix(hw, ht, make, message):
    if "tensorboard" in message:
        pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    with pytest.raises(hw.HookError, match=re.escape(message)):
        make(ht)


def test_a_logger_with_loggers_pickles_copies_and_resumes(hw, ht):
    loop = make_loop(hw)
    mine = Recorder()
    logger = ht.MetricsLogger(loggers=[mine])
    loop.add_callback(logger)
    for batch in loop.batches:
        loop.step(batch)  # 3 tensor losses queued, none read
    restored = pickle.loads(pickle.dumps(logger))  # reads back and sends first
    assert [step for step, _ in mine.calls] == [1, 2, 3] and restored.rows == []
    assert [step for step, _ in restored.loggers[0].calls] == [1, 2, 3]
    copied = copy.deepcopy(logger)
    assert copied.loggers[0] is not mine and copied.state_key == "MetricsLogger[Recorder]"
    state = hw.callback_state(loop)
    assert state["MetricsLogger[Recorder]"] == {"step": 3, "losses": 3}
    fresh = make_loop(hw)
    again = Recorder()
    fresh.add_callback(ht.MetricsLogger(loggers=[again]))
    hw.load_callback_state(fresh, state)
    fresh.fit(1)
    assert [step for step, _ in again.calls] == [4, 5, 6, 6]  # the resumed run goes on counting


def _epochs_loop(hw: Any) -> Any:
    class Loop(hw.Hookable):
        def __init__(self) -> None:
            torch.manual_seed(0)
            self.model = torch.nn.Linear(3, 1)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            self.batches = _data(3)

        @hw.hookable
        def fit(self, first: int, last: int) -> None:
            for index in range(first, last):
                for batch in self.batches:
                    self.step(batch)
                self.evaluate(index)

        @hw.hookable
        def step(self, batch: Any) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            return loss

        @hw.hookable
        def evaluate(self, index: int) -> dict[str, float]:
            return {"val_loss": 1.0 / (index + 1)}

    return Loop()


def test_a_resumed_run_logs_each_step_once_and_sets_aside_what_it_redoes(hw, ht, tmp_path):
    """A checkpoint after epoch 1, a run on through epoch 2 that dies, then a resume
    from the checkpoint: the CSV equals the uninterrupted run's (each step once), and
    the dead run's rows of epoch 2 are in metrics.before-resume.csv, said."""
    straight = _epochs_loop(hw)
    straight.add_callback(ht.MetricsLogger(tmp_path / "straight.csv", loss_event="step", tensorboard=False))
    straight.fit(0, 3)
    path = tmp_path / "metrics.csv"
    first = _epochs_loop(hw)
    first.add_callback(ht.MetricsLogger(path, loss_event="step", tensorboard=False))
    first.fit(0, 1)
    checkpoint = {"model": copy.deepcopy(first.model.state_dict()),
                  "optimizer": copy.deepcopy(first.optimizer.state_dict()), "callbacks": hw.callback_state(first)}
    first.fit(1, 2)  # then the process dies: these rows are logged again by the resumed run
    resumed = _epochs_loop(hw)
    resumed.model.load_state_dict(checkpoint["model"])
    resumed.optimizer.load_state_dict(checkpoint["optimizer"])
    resumed.add_callback(ht.MetricsLogger(path, loss_event="step", tensorboard=False))
    hw.load_callback_state(resumed, checkpoint["callbacks"])
    with pytest.warns(hw.HookwrapWarning, match=r"resumed from a state saved before 4 rows of steps 4-6 were "
                                                  r"written, and logs from step 4 again: those rows were moved to"):
        resumed.fit(1, 3)
    expected = (tmp_path / "straight.csv").read_text()
    assert path.read_text() == expected and expected.count("\n") == 1 + 9 + 3
    aside = (tmp_path / "metrics.before-resume.csv").read_text().splitlines()
    assert aside[0] == "step,name,value" and aside[1:] == expected.splitlines()[5:9]
