"""Checkpoints of a model that is an ``nn.Module`` and ``Hookable``: ``torch.save`` /
``torch.load`` and ``copy.deepcopy`` keep its per-instance callbacks, its
``state_dict()`` holds nothing of hookwrap's, and a callback pickle cannot save
fails naming itself and its event (both implementations)."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra")
nn = torch.nn

Net: Any = None  # built per implementation, module-level so pickle finds it


def scale_input(self: Any, x: Any) -> Any:
    return x * 2


@pytest.fixture
def net_class(hw):
    global Net

    class Net(nn.Module, hw.Hookable):  # type: ignore[no-redef]
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 2)

        @hw.hookable
        def forward(self, x):
            return self.linear(x)

    Net.__qualname__ = "Net"
    return Net


def _saved_and_loaded(model: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_torch_save_and_load_keep_the_instance_callbacks(net_class):
    torch.manual_seed(0)
    model = net_class()
    x = torch.ones(1, 3)
    plain = model(x)
    model.before("forward", scale_input)
    doubled = model(x)
    assert not torch.equal(plain, doubled)
    loaded = _saved_and_loaded(model)
    assert torch.equal(loaded(x), doubled)  # the callback came back with the model
    assert loaded.callbacks == [("pre-forward", scale_input)]
    loaded.callbacks.clear()  # and the loaded model's list is its own
    assert torch.equal(loaded(x), plain) and torch.equal(model(x), doubled)


def test_state_dict_holds_only_the_weights(net_class):
    model = net_class()
    model.before("forward", scale_input)
    assert set(model.state_dict()) == {"linear.weight", "linear.bias"}
    fresh = net_class()
    fresh.load_state_dict(model.state_dict())
    assert fresh.callbacks == []


def test_deepcopy_copies_callbacks_even_a_lambda(net_class):
    model = net_class()
    model.before("forward", lambda self, x: x * 0)
    clone = copy.deepcopy(model)
    assert torch.equal(clone(torch.ones(1, 3)), model(torch.ones(1, 3)))
    assert clone.linear.weight is not model.linear.weight


def test_saving_a_model_with_a_lambda_callback_says_which_and_how(hw, net_class):
    model = net_class()
    model.before("forward", lambda self, x: x)
    with pytest.raises(hw.CallbackPicklingError, match=r"callback \S*<lambda> \(test_checkpoints.py:\d+\) for event 'pre-forward' is a lambda.*torch.save\(obj.state_dict\(\), path\)"):
        torch.save(model, io.BytesIO())


@pytest.mark.parametrize("save", ["torch.save", "copy.deepcopy"])
def test_shipped_callbacks_are_saved_with_the_model_and_keep_working(hw, net_class, save):
    ht = pytest.importorskip("hookwrap.torch")
    model = net_class()
    guard, timer = ht.NanGuard(events="forward", step_event=None, check_every=1), ht.StepTimer(step_event="forward")
    model.add_callback(guard)
    model.add_callback(timer)
    model(torch.ones(1, 3))
    loaded = _saved_and_loaded(model) if save == "torch.save" else copy.deepcopy(model)
    described = str(hw.describe(loaded, "forward"))
    assert "NanGuard.check[forward]" in described and "StepTimer.stop" in described
    # The loaded model has copies of the callbacks, with the state they had.
    owners = {type(fn.__self__): fn.__self__ for _, fn in loaded.callbacks}
    loaded_guard, loaded_timer = owners[ht.NanGuard], owners[ht.StepTimer]
    assert loaded_guard is not guard and loaded_timer is not timer
    loaded(torch.ones(1, 3))
    assert (loaded_guard.checked, loaded_timer.count) == (2, 2)
    assert (guard.checked, timer.count) == (1, 1)  # the original's saw none of those calls
    with pytest.raises(ht.NonFiniteError, match=r"event 'post-forward' returned nan"):
        loaded(torch.full((1, 3), float("nan")))
