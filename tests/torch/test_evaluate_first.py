"""``EvaluateFirst``: one evaluation before the first step, fed to every callback on
the evaluation (HF's ``eval_on_start`` is compared in tests/integrations/test_transformers.py)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra")


def _loop(hw: Any, evaluate_needs_data: bool = False) -> Any:
    class Loop(hw.Hookable):
        def __init__(self) -> None:
            self.calls: list[str] = []
            self.value = 3.0

        @hw.hookable
        def fit(self, steps: int) -> None:
            for _ in range(steps):
                self.step()
            self.evaluate()

        @hw.hookable
        def step(self) -> None:
            self.calls.append("step")
            self.value -= 1.0

        if evaluate_needs_data:
            @hw.hookable
            def evaluate(self, data: Any) -> dict[str, float]:
                return {"val_loss": self.value}
        else:
            @hw.hookable
            def evaluate(self) -> dict[str, float]:
                self.calls.append("evaluate")
                return {"val_loss": self.value}

    return Loop()


def test_it_evaluates_once_before_the_first_step_and_every_callback_sees_it(hw, ht, tmp_path):
    loop = _loop(hw)
    first, early = ht.EvaluateFirst(), ht.EarlyStopping("val_loss", patience=5)
    logger = ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False)
    for cb in (first, early, logger):
        loop.add_callback(cb)
    loop.fit(2)
    assert loop.calls == ["evaluate", "step", "step", "evaluate"] and first.evaluations == 1
    assert [(step, name, value) for step, name, value in logger.read()] == [(0, "val_loss", 3.0),
                                                                           (2, "val_loss", 1.0)]
    assert early.best.value == 1.0 and early.best_step == 2


def test_an_evaluation_that_needs_arguments_is_refused_when_attached(hw, ht):
    loop = _loop(hw, evaluate_needs_data=True)
    with pytest.raises(hw.HookError, match=r"EvaluateFirst.*'evaluate' needs data, and it is called with none"):
        loop.add_callback(ht.EvaluateFirst())
    with pytest.raises(hw.SettingError, match=r"event must be a join point name"):
        ht.EvaluateFirst(event="")


def test_the_model_trains_after_an_evaluation_that_switched_it_to_eval(hw, ht):
    """An evaluate() that calls model.eval() (and leaves it so): the first steps still
    run in training mode, as the loop had set it."""
    class Loop(hw.Hookable):
        def __init__(self) -> None:
            self.model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
            self.modes: list[bool] = []

        @hw.hookable
        def fit(self, steps: int) -> None:
            self.model.train()
            for _ in range(steps):
                self.step()

        @hw.hookable
        def step(self) -> None:
            self.modes.append(self.model[1].training)

        @hw.hookable
        def evaluate(self) -> dict[str, float]:
            self.model.eval()
            return {"val_loss": 1.0}

    loop = Loop()
    loop.add_callback(ht.EvaluateFirst())
    loop.fit(3)
    assert loop.modes == [True, True, True]
