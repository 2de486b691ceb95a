"""EMA and Autocast, callbacks that change the loop: their numbers against the same
loop written by hand (CPU, a tiny model, synthetic seeded data, both implementations)."""

from __future__ import annotations

import copy
import io
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's NumPy notice

STEPS, DECAY, LR = 7, 0.9, 0.1


def make_model() -> Any:
    torch.manual_seed(0)
    # A buffer-carrying layer too: its running statistics are copied, not averaged.
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))


def make_data() -> tuple[list[Any], Any]:
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 4, generator=gen), torch.randn(8, 3, generator=gen)) for _ in range(STEPS)]
    return batches, torch.randn(5, 4, generator=gen)


def make_trainer(hw: Any) -> Any:
    class Trainer(hw.Hookable):
        def __init__(self) -> None:
            self.model = make_model()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR, momentum=0.9)
            self.batches, self.val_x = make_data()
            self.fail_eval = False
            self.seen_in_eval: list[Any] = []
            self.autocast_in_step: list[tuple[bool, Any]] = []

        @hw.hookable
        def fit(self, steps: int) -> None:
            for batch in self.batches[:steps]:
                self.step(batch)

        @hw.hookable
        def step(self, batch: tuple[Any, Any]) -> Any:
            x, y = batch
            out = self.model(x)
            self.autocast_in_step.append((torch.is_autocast_enabled("cpu"), out.dtype))
            loss = self.loss(out, y)
            self.backward(loss)
            self.optimizer_step()
            return loss.detach()

        @hw.hookable
        def loss(self, out: Any, y: Any) -> Any:
            return torch.nn.functional.mse_loss(out.float(), y)

        @hw.hookable
        def backward(self, loss: Any) -> None:
            loss.backward()

        @hw.hookable
        def optimizer_step(self) -> None:
            self.optimizer.step()
            self.optimizer.zero_grad()

        @hw.hookable
        def evaluate(self) -> Any:
            self.seen_in_eval.append([t.detach().clone() for t in weights(self.model)])
            self.model.eval()
            try:
                if self.fail_eval:
                    raise RuntimeError("evaluation failed")
                with torch.no_grad():
                    return self.model(self.val_x)
            finally:
                self.model.train()

    return Trainer()


def weights(model: Any) -> list[Any]:
    """Parameters, then buffers: the order EMA keeps them in."""
    return [p.detach() for p in model.parameters()] + [b.detach() for b in model.buffers()]


def hand_ema(steps: int, decay: float = DECAY) -> tuple[Any, list[Any]]:
    """The same loop with no hookwrap at all, the average updated inline after each
    optimizer step: the first copies, then ema = decay * ema + (1 - decay) * w."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    batches, _ = make_data()
    n_params = len(list(model.parameters()))
    ema: list[Any] | None = None
    for x, y in batches[:steps]:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            if ema is None:
                ema = [t.clone() for t in weights(model)]
            else:
                for i, (e, w) in enumerate(zip(ema, weights(model))):
                    if i < n_params:
                        e.mul_(decay).add_(w, alpha=1 - decay)
                    else:
                        e.copy_(w)
    assert ema is not None
    return model, ema


def all_equal(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# --- EMA -------------------------------------------------------------------------------


def test_ema_equals_the_average_written_by_hand_after_k_steps(hw, ht):
    trainer, ema = make_trainer(hw), ht.EMA(decay=DECAY)
    trainer.add_callback(ema)
    trainer.fit(STEPS)
    model, expected = hand_ema(STEPS)
    assert ema.updates == STEPS
    assert all_equal(weights(trainer.model), weights(model))  # the training itself is unchanged
    assert all_equal(ema.shadow, expected)  # bit for bit (atol=0)
    assert not all_equal(ema.shadow[:2], weights(model)[:2])  # and it is not just the weights


def test_evaluate_sees_the_average_and_the_training_weights_come_back(hw, ht):
    trainer, ema = make_trainer(hw), ht.EMA(decay=DECAY)
    trainer.add_callback(ema)
    trainer.fit(STEPS)
    training = [t.clone() for t in weights(trainer.model)]
    result = trainer.evaluate()

    model, expected = hand_ema(STEPS)
    averaged = copy.deepcopy(model)
    with torch.no_grad():
        for dst, src in zip(weights(averaged), expected):
            dst.copy_(src)
    averaged.eval()
    with torch.no_grad():
        by_hand = averaged(make_data()[1])
    assert torch.equal(result, by_hand)
    assert all_equal(trainer.seen_in_eval[-1], expected)
    assert all_equal(weights(trainer.model), training)  # swapped back
    assert trainer.model.training


def test_the_training_weights_come_back_when_evaluate_raises(hw, ht):
    trainer, ema = make_trainer(hw), ht.EMA(decay=DECAY)
    trainer.add_callback(ema)
    trainer.fit(3)
    training = [t.clone() for t in weights(trainer.model)]
    trainer.fail_eval = True
    with pytest.raises(RuntimeError, match="evaluation failed"):
        trainer.evaluate()
    assert all_equal(trainer.seen_in_eval[-1], ema.shadow)  # it raised with the average in
    assert all_equal(weights(trainer.model), training)
    trainer.fail_eval = False
    trainer.fit(STEPS)  # and training goes on from the training weights
    assert ema.updates == 3 + STEPS


def test_evaluate_before_any_update_leaves_the_model_alone(hw, ht):
    trainer, ema = make_trainer(hw), ht.EMA(decay=DECAY)
    trainer.add_callback(ema)
    before = [t.clone() for t in weights(trainer.model)]
    trainer.evaluate()
    assert ema.shadow is None and all_equal(trainer.seen_in_eval[-1], before)


def test_ema_state_round_trips_through_callback_state(hw, ht):
    trainer, ema = make_trainer(hw), ht.EMA(decay=DECAY)
    trainer.add_callback(ema)
    trainer.fit(STEPS)
    buffer = io.BytesIO()
    torch.save(hw.callback_state(trainer), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    resumed, resumed_ema = make_trainer(hw), ht.EMA(decay=DECAY)
    resumed.add_callback(resumed_ema)
    hw.load_callback_state(resumed, saved)
    assert resumed_ema.updates == STEPS and all_equal(resumed_ema.shadow, ema.shadow)
    # The next update continues from the loaded average, as the original does.
    resumed.model.load_state_dict(trainer.model.state_dict())
    for t in (trainer, resumed):
        t.optimizer_step()
    assert all_equal(resumed_ema.shadow, ema.shadow) and resumed_ema.updates == STEPS + 1


def test_ema_reads_nothing_back_per_step(hw, ht):
    trainer, ema = make_trainer(hw), ht.EMA(decay=DECAY)
    trainer.add_callback(ema)
    with ht.count_host_reads() as reads:
        trainer.fit(STEPS)
        trainer.evaluate()
    assert ema.updates == STEPS and reads.count == 0, reads


def test_ema_reads_the_model_from_an_argument_of_a_function_join_point(hw, ht):
    model = make_model()

    @hw.hookable
    def optimizer_step(model: Any) -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)

    ema = ht.EMA(decay=0.5, event="optimizer_step", eval_event=None)
    hw.add_callback(optimizer_step, ema)
    start = [p.detach().clone() for p in model.parameters()]
    optimizer_step(model)
    optimizer_step(model)
    assert all_equal(ema.shadow[:len(start)], [p + 1.5 for p in start])  # 0.5 * (p + 1) + 0.5 * (p + 2)


@pytest.mark.parametrize("decay", [0, 1, 1.0, -0.1, 1.5, math.nan, math.inf, True, "0.9", None])
def test_ema_refuses_a_decay_outside_0_1(hw, ht, decay):
    with pytest.raises(hw.HookError, match="decay must be a number strictly between 0 and 1"):
        ht.EMA(decay=decay)


def test_ema_refuses_a_target_missing_its_events_when_attached(hw, ht):
    class NoStep(hw.Hookable):
        model = torch.nn.Linear(2, 1)

        @hw.hookable
        def evaluate(self) -> None:
            pass

    with pytest.raises(hw.UnknownEventError, match="optimizer_step"):
        NoStep().add_callback(ht.EMA())
    with pytest.raises(hw.UnknownEventError, match="Did you mean 'evaluate'"):
        make_trainer(hw).add_callback(ht.EMA(eval_event="evaluat"))
    with pytest.raises(hw.HookError, match="eval_event must be the name of a join point or None"):
        ht.EMA(eval_event="")
    trainer = make_trainer(hw)
    trainer.add_callback(ht.EMA(eval_event=None))  # no evaluation: attaches to optimizer_step alone
    trainer.fit(1)


# --- Autocast ----------------------------------------------------------------------------


def test_autocast_runs_the_chosen_join_point_under_bfloat16_on_cpu(hw, ht):
    trainer = make_trainer(hw)
    trainer.add_callback(ht.Autocast())  # events=("step",); the model is on the CPU
    trainer.fit(2)
    assert trainer.autocast_in_step == [(True, torch.bfloat16)] * 2
    assert not torch.is_autocast_enabled("cpu")  # outside the join point: off
    assert trainer.evaluate().dtype == torch.float32  # not a chosen join point


def test_autocast_training_equals_the_loop_written_by_hand(hw, ht):
    trainer = make_trainer(hw)
    trainer.add_callback(ht.Autocast())
    trainer.fit(STEPS)

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for x, y in make_data()[0][:STEPS]:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert all_equal(weights(trainer.model), weights(model))


def test_autocast_settings_and_a_function_join_point(hw, ht):
    model = torch.nn.Linear(4, 2)
    assert ht.Autocast().settings(model) == ("cpu", torch.bfloat16)
    assert ht.Autocast().settings() == ("cpu", torch.bfloat16)  # no model: the CPU
    assert ht.Autocast(dtype=torch.float16).settings(model) == ("cpu", torch.float16)

    @hw.hookable
    def forward(model: Any, x: Any) -> Any:
        return model(x)

    hw.add_callback(forward, ht.Autocast(events="forward"))
    assert forward(model, torch.ones(3, 4)).dtype == torch.bfloat16
    assert model(torch.ones(3, 4)).dtype == torch.float32


@pytest.mark.parametrize("kwargs, message", [
    ({"events": ()}, "events must be a join point name or a non-empty tuple"),
    ({"events": ("step", 3)}, "events must be a join point name or a non-empty tuple"),
    ({"events": ""}, "events must be a join point name or a non-empty tuple"),
    ({"device_type": "gpu0"}, "device_type must be a device type torch.autocast supports"),
    ({"device_type": 0}, "device_type must be a device type torch.autocast supports"),
    ({"dtype": torch.float32}, "dtype must be torch.float16, torch.bfloat16 or None"),
    ({"dtype": "bfloat16"}, "dtype must be torch.float16, torch.bfloat16 or None"),
    ({"model": None}, "model must be an argument or attribute name"),
])
def test_autocast_refuses_bad_input(hw, ht, kwargs, message):
    with pytest.raises(hw.HookError, match=message):
        ht.Autocast(**kwargs)


def test_autocast_refuses_cuda_without_cuda_and_a_misspelled_event(hw, ht):
    if not torch.cuda.is_available():
        with pytest.raises(hw.HookError, match="CUDA is not available"):
            ht.Autocast(device_type="cuda")
    with pytest.raises(hw.UnknownEventError, match="Did you mean 'step'"):
        make_trainer(hw).add_callback(ht.Autocast(events=("stepp",)))
