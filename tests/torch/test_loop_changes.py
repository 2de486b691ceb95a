"""GradClip and GradAccumulation (hookwrap.torch.loop_changes): the weights after K
steps are exactly (torch.equal) those of the same loop written by hand, on the
example trainer and on a plain hookable loop, both implementations."""

from __future__ import annotations

import importlib
import math
import types
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's NumPy notice

K = 12  # steps (calls of the step join point) per run


@pytest.fixture
def example(hw):
    """hookwrap.examples.trainer, imported with the implementation under test."""
    return importlib.import_module("hookwrap.examples.trainer")


def first_batches(trainer, k=K):
    batches = []
    for batch in trainer.train_loader:
        batches.append(batch)
        if len(batches) == k:
            return batches
    raise AssertionError("not enough batches")


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def make_plain_loop(hw, seed=0, model_argument=False):
    """A plain hookable loop: zero_grad inside optimizer_step, as the example trainer does."""

    class Loop(hw.Hookable):
        def __init__(self):
            torch.manual_seed(seed)
            self.model = torch.nn.Linear(3, 2)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.5, momentum=0.9)

        @hw.hookable
        def step(self, x, y):
            loss = self.loss(self.model(x), y)
            if model_argument:
                self.backward_with(loss, self.model)
            else:
                self.backward(loss)
            self.optimizer_step()
            return loss.detach()

        @hw.hookable
        def loss(self, out, y):
            return torch.nn.functional.mse_loss(out, y)

        @hw.hookable
        def backward(self, loss) -> None:
            loss.backward()

        @hw.hookable
        def backward_with(self, loss, model) -> None:
            loss.backward()

        @hw.hookable
        def optimizer_step(self) -> None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    return Loop()


def plain_data(k=K):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 3, generator=gen) * 5, torch.randn(8, 2, generator=gen)) for _ in range(k)]


# --- GradClip ----------------------------------------------------------------------------


@pytest.mark.parametrize("max_norm", [0.05, 1e6])
def test_grad_clip_matches_hand_written_clipping_on_the_example_trainer(hw, ht, example, max_norm):
    hooked, hand = example.make_run(seed=3), example.make_run(seed=3)
    hooked.add_callback(ht.GradClip(max_norm=max_norm))
    for batch in first_batches(hooked):
        hooked.step(batch)
    model, optimizer = hand.model, hand.optimizer
    for inputs, targets in first_batches(hand):
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, 2.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    same_weights(hooked.model, hand.model)


def test_grad_clip_changes_the_weights_when_the_norm_is_above_max_norm(hw, ht, example):
    clipped, unclipped = example.make_run(seed=3), example.make_run(seed=3)
    clipped.add_callback(ht.GradClip(max_norm=0.05))
    for loop in (clipped, unclipped):
        for batch in first_batches(loop, 3):
            loop.step(batch)
    assert not torch.equal(clipped.model[0].weight, unclipped.model[0].weight)


@pytest.mark.parametrize("norm_type", [1.0, float("inf")])
@pytest.mark.parametrize("model_argument", [False, True])
def test_grad_clip_matches_hand_written_clipping_on_a_plain_loop(hw, ht, norm_type, model_argument):
    loop, hand = make_plain_loop(hw, model_argument=model_argument), make_plain_loop(hw)
    event = "backward_with" if model_argument else "backward"
    loop.add_callback(ht.GradClip(0.3, norm_type=norm_type, event=event))
    for x, y in plain_data():
        loop.step(x, y)
    for x, y in plain_data():
        torch.nn.functional.mse_loss(hand.model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(hand.model.parameters(), 0.3, norm_type)
        hand.optimizer.step()
        hand.optimizer.zero_grad(set_to_none=True)
    same_weights(loop.model, hand.model)


def test_grad_clip_reads_nothing_back_to_the_host(hw, ht, example):
    batches = first_batches(example.make_run(seed=3), 4)
    counts = []
    for clip in (False, True):
        trainer = example.make_run(seed=3)
        if clip:
            trainer.add_callback(ht.GradClip(max_norm=0.05))
        with ht.count_host_reads() as reads:
            for batch in batches:
                trainer.step(batch)
        counts.append(reads.count)
    assert counts[1] - counts[0] == 0  # AdamW's own reads (its step counter on CPU) are the same
    loop = make_plain_loop(hw)  # SGD reads nothing: the run with GradClip reads nothing at all
    loop.add_callback(ht.GradClip(0.3))
    with ht.count_host_reads() as reads:
        for x, y in plain_data(4):
            loop.step(x, y)
    assert reads.count == 0


# --- GradAccumulation --------------------------------------------------------------------


@pytest.mark.parametrize("steps", [1, 3, 4])
def test_grad_accumulation_matches_hand_written_accumulation_on_the_example_trainer(hw, ht, example, steps):
    hooked, hand = example.make_run(seed=5), example.make_run(seed=5)
    acc = ht.GradAccumulation(steps)
    hooked.add_callback(acc)
    returned = [hooked.step(batch) for batch in first_batches(hooked)]
    model, optimizer = hand.model, hand.optimizer
    expected = []
    for i, (inputs, targets) in enumerate(first_batches(hand)):
        loss = torch.nn.functional.cross_entropy(model(inputs), targets) / steps
        loss.backward()
        expected.append(loss.detach())
        if (i + 1) % steps == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    same_weights(hooked.model, hand.model)
    assert all(torch.equal(a, b) for a, b in zip(returned, expected))  # the loss, scaled
    assert acc.calls == K
    assert hw.callback_state(hooked) == {"GradAccumulation[event=optimizer_step]": {"calls": K}}


def test_grad_accumulation_steps_the_optimizer_every_steps_calls(hw, ht, example):
    trainer = example.make_run(seed=5)
    trainer.add_callback(ht.GradAccumulation(4))
    stepped = []
    trainer.after("optimizer_step", lambda self: stepped.append(self.steps))
    for batch in first_batches(trainer, 9):
        trainer.step(batch)
    # post-optimizer_step runs outside the around advice: each call, stepped or not.
    assert len(stepped) == 9
    assert trainer.optimizer.state_dict()["state"][0]["step"].item() == 2  # steps 4 and 8
    assert trainer.model[0].weight.grad is not None  # the 9th call's gradients, kept


@pytest.mark.parametrize("steps", [2, 5])
def test_grad_accumulation_matches_hand_written_accumulation_on_a_plain_loop(hw, ht, steps):
    loop, hand = make_plain_loop(hw), make_plain_loop(hw)
    loop.add_callback(ht.GradAccumulation(steps))
    for x, y in plain_data():
        loop.step(x, y)
    for i, (x, y) in enumerate(plain_data()):
        (torch.nn.functional.mse_loss(hand.model(x), y) / steps).backward()
        if (i + 1) % steps == 0:
            hand.optimizer.step()
            hand.optimizer.zero_grad(set_to_none=True)
    same_weights(loop.model, hand.model)


@pytest.mark.parametrize("model_given", [False, True])
def test_grad_accumulation_clips_the_accumulated_gradients_once_before_each_step(hw, ht, model_given):
    """clip_grad_norm=: the hand-written loop clips the sum of `steps` micro-batches'
    gradients, once, before optimizer.step(); clipping after every backward differs."""
    steps, max_norm = 3, 0.05
    loop, hand, each = make_plain_loop(hw), make_plain_loop(hw), make_plain_loop(hw)
    loop.add_callback(ht.GradAccumulation(steps, clip_grad_norm=max_norm,
                                          model=loop.model if model_given else "model"))
    each.add_callback(ht.GradAccumulation(steps))
    each.add_callback(ht.GradClip(max_norm))  # after every backward
    with ht.count_host_reads() as reads:
        for x, y in plain_data():
            loop.step(x, y)
    assert reads.count == 0
    for x, y in plain_data():
        each.step(x, y)
    norms = []
    for i, (x, y) in enumerate(plain_data()):
        (torch.nn.functional.mse_loss(hand.model(x), y) / steps).backward()
        if (i + 1) % steps == 0:
            norms.append(torch.nn.utils.clip_grad_norm_(hand.model.parameters(), max_norm).item())
            hand.optimizer.step()
            hand.optimizer.zero_grad(set_to_none=True)
    assert max(norms) > max_norm  # the clipping did something
    same_weights(loop.model, hand.model)
    assert not all(torch.equal(a, b) for a, b in zip(each.model.parameters(), hand.model.parameters()))


def test_grad_accumulation_clipping_on_functions_needs_the_model_itself(hw, ht):
    model = torch.nn.Linear(3, 2)

    @hw.hookable
    def loss(x: Any) -> Any:
        return x

    @hw.hookable
    def optimizer_step() -> None:
        pass

    functions = types.ModuleType("loop_functions")
    functions.loss, functions.optimizer_step = loss, optimizer_step
    with pytest.raises(hw.CallbackSignatureError, match=r"no object to read the model from.*Pass model= the module"):
        hw.add_callback(functions, ht.GradAccumulation(2, clip_grad_norm=1.0))
    assert loss(4.0) == 4.0  # nothing left registered by the refused attach
    handle = hw.add_callback(functions, ht.GradAccumulation(2, clip_grad_norm=1.0, model=model))
    assert loss(4.0) == 2.0
    handle.remove()


@pytest.mark.parametrize("kwargs, message", [
    ({"clip_grad_norm": 0}, "GradAccumulation: clip_grad_norm must be a number > 0 and finite, got 0"),
    ({"clip_grad_norm": math.inf}, "GradAccumulation: clip_grad_norm must be a number > 0 and finite"),
    ({"norm_type": -1}, "GradAccumulation: norm_type must be a number > 0, got -1"),
    ({"clip_grad_norm": 1.0, "model": None}, "GradAccumulation: model must be the name of the attribute"),
])
def test_grad_accumulation_refuses_bad_clipping(hw, ht, kwargs, message):
    with pytest.raises(hw.HookError, match=message):
        ht.GradAccumulation(2, **kwargs)


def test_grad_accumulation_with_a_misnamed_model_fails_at_the_first_call(hw, ht):
    loop = make_plain_loop(hw)
    loop.add_callback(ht.GradAccumulation(3, clip_grad_norm=1.0, model="modle"))
    x, y = plain_data()[0]
    with pytest.raises(hw.HookError, match=r"Loop has no attribute 'modle' to read the model from"):
        loop.step(x, y)


def test_grad_accumulation_in_the_global_tier_and_saved_with_the_trainer(hw, ht, example):
    import io

    loop, hand = make_plain_loop(hw), make_plain_loop(hw)
    with ht.GradAccumulation(3):  # every hookable loop with these join points, for the block
        for x, y in plain_data():
            loop.step(x, y)
    for i, (x, y) in enumerate(plain_data()):
        (torch.nn.functional.mse_loss(hand.model(x), y) / 3).backward()
        if (i + 1) % 3 == 0:
            hand.optimizer.step()
            hand.optimizer.zero_grad(set_to_none=True)
    same_weights(loop.model, hand.model)

    trainer = example.make_run(seed=1)
    trainer.add_callback(ht.GradAccumulation(2))
    trainer.add_callback(ht.GradClip(1.0))
    batch = first_batches(trainer, 1)[0]
    trainer.step(batch)
    buffer = io.BytesIO()
    torch.save(trainer, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    loaded.step(batch)
    assert hw.callback_state(loaded) == {"GradAccumulation[event=optimizer_step]": {"calls": 2}}
    assert loaded.optimizer.state_dict()["state"][0]["step"].item() == 1  # stepped on the 2nd call


def test_grad_accumulation_on_hookable_functions(hw, ht):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    hand_model = torch.nn.Linear(3, 2)
    hand_model.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    hand_optimizer = torch.optim.SGD(hand_model.parameters(), lr=0.5)

    @hw.hookable
    def loss(out, y):
        return torch.nn.functional.mse_loss(out, y)

    @hw.hookable
    def optimizer_step(optimizer) -> None:
        optimizer.step()
        optimizer.zero_grad()

    functions = types.ModuleType("loop_functions")
    functions.loss, functions.optimizer_step = loss, optimizer_step
    handle = hw.add_callback(functions, ht.GradAccumulation(3))
    try:
        for x, y in plain_data():
            loss(model(x), y).backward()
            optimizer_step(optimizer)
    finally:
        handle.remove()
    for i, (x, y) in enumerate(plain_data()):
        (torch.nn.functional.mse_loss(hand_model(x), y) / 3).backward()
        if (i + 1) % 3 == 0:
            hand_optimizer.step()
            hand_optimizer.zero_grad()
    same_weights(model, hand_model)


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [0, -2, 2.0, True, "4", None])
def test_grad_accumulation_refuses_bad_steps(hw, ht, steps):
    with pytest.raises(hw.HookError, match=r"GradAccumulation: steps must be a whole number >= 1"):
        ht.GradAccumulation(steps)


@pytest.mark.parametrize("max_norm", [0, -1.0, float("nan"), float("inf"), "1", None, True])
def test_grad_clip_refuses_bad_max_norm(hw, ht, max_norm):
    with pytest.raises(hw.HookError, match=r"GradClip: max_norm must be a number > 0"):
        ht.GradClip(max_norm)


def test_grad_clip_refuses_bad_norm_type(hw, ht):
    with pytest.raises(hw.HookError, match=r"GradClip: norm_type must be a number > 0"):
        ht.GradClip(1.0, norm_type=0)


def test_missing_events_are_refused_when_attached(hw, ht):
    class NoStep(hw.Hookable):
        model = torch.nn.Linear(1, 1)

        @hw.hookable
        def loss(self, x):
            return x

    with pytest.raises(hw.UnknownEventError, match=r"GradAccumulation.*'optimizer_step'"):
        NoStep().add_callback(ht.GradAccumulation(2))
    with pytest.raises(hw.UnknownEventError, match=r"GradAccumulation.*'los'.*Did you mean 'loss'"):
        NoStep().add_callback(ht.GradAccumulation(2, event="loss", loss_event="los"))
    with pytest.raises(hw.UnknownEventError, match=r"GradClip.*'backward'"):
        NoStep().add_callback(ht.GradClip(1.0))
    loop = make_plain_loop(hw)
    with pytest.raises(hw.CallbackSignatureError, match=r"returns None"):
        loop.add_callback(ht.GradAccumulation(2, loss_event="backward"))
    assert loop.callbacks == [] or not loop.callbacks  # nothing half-attached
