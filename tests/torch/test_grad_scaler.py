"""GradScaler: float16 loss scaling woven into a loop equals the same loop written by
hand with torch.amp (weights bit for bit, the scale after every step, the steps
skipped), with GradClip clipping the unscaled gradients in either attach order; on
the torch_optim preset; resumed from callback_state; on CUDA where there is one."""

from __future__ import annotations

import importlib
import io
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's NumPy / scheduler-order notices

STEPS, BAD_STEP, LR, MAX_NORM = 10, 4, 0.05, 0.5
SCALER = {"init_scale": 2.0 ** 12, "growth_interval": 3}


def make_model(device: str = "cpu") -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).to(device)


def make_data(device: str = "cpu") -> list[tuple[Any, Any]]:
    """Seeded batches; batch BAD_STEP (1-based) overflows float16 (its step is skipped)."""
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 4, generator=gen), torch.randn(8, 3, generator=gen)) for _ in range(STEPS)]
    batches[BAD_STEP - 1][0][0, 0] = 1e30
    return [(x.to(device), y.to(device)) for x, y in batches]


def make_trainer(hw: Any, device: str = "cpu") -> Any:
    class Trainer(hw.Hookable):
        def __init__(self) -> None:
            self.model = make_model(device)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR, momentum=0.9)
            self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5)
            self.batches = make_data(device)
            self.losses: list[Any] = []

        @hw.hookable
        def fit(self, start: int, stop: int) -> None:
            for batch in self.batches[start:stop]:
                self.step(batch)

        @hw.hookable
        def step(self, batch: tuple[Any, Any]) -> Any:
            x, y = batch
            loss = self.loss(self.forward(x), y)
            self.backward(loss)
            self.optimizer_step()
            return loss.detach()

        @hw.hookable
        def forward(self, x: Any) -> Any:
            return self.model(x)

        @hw.hookable
        def loss(self, out: Any, y: Any) -> Any:
            loss = torch.nn.functional.mse_loss(out.float(), y)
            self.losses.append(loss.detach())
            return loss

        @hw.hookable
        def backward(self, loss: Any) -> None:
            loss.backward()

        @hw.hookable
        def optimizer_step(self) -> None:
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.scheduler.step()

    return Trainer()


def hand_loop(device: str = "cpu", clip: bool = True, start: int = 0, stop: int = STEPS,
              state: dict[str, Any] | None = None, schedule: bool = True) -> tuple[Any, list[float], list[int], Any]:
    """The same training with no hookwrap: the torch.amp recipe, written out
    (``schedule=False``: no learning-rate scheduler)."""
    model = make_model(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5 if schedule else 1.0)
    scaler = torch.amp.GradScaler(device, **SCALER)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
    scales, skipped = [], []
    for i, (x, y) in enumerate(make_data(device)[start:stop], start=start + 1):
        with torch.autocast(device, dtype=torch.float16):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        if sum(v.item() for v in scaler._found_inf_per_device(optimizer).values()):
            skipped.append(i)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        scheduler.step()
        scales.append(scaler.get_scale())
    return model, scales, skipped, scaler


def params(model: Any) -> list[Any]:
    return [p.detach() for p in model.parameters()]


def all_equal(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def train(hw: Any, ht: Any, device: str = "cpu", clip_first: bool | None = False, steps: int = STEPS) \
        -> tuple[Any, Any, list[float]]:
    """The woven loop: Autocast(float16) on forward, GradScaler, and GradClip attached
    before it (clip_first), after it, or not at (None); the scale after each step."""
    trainer = make_trainer(hw, device)
    trainer.add_callback(ht.Autocast(events="forward", dtype=torch.float16))
    scaler = ht.GradScaler(device, **SCALER)
    clip = [ht.GradClip(MAX_NORM)] if clip_first is not None else []
    for cb in (clip + [scaler]) if clip_first else ([scaler] + clip):
        trainer.add_callback(cb)
    scales: list[float] = []
    trainer.after("step", lambda self: scales.append(scaler.scaler.get_scale()))
    trainer.fit(0, steps)
    return trainer, scaler, scales


@pytest.mark.parametrize("clip_first", [False, True, None], ids=["clip-after", "clip-first", "no-clip"])
def test_float16_with_grad_scaler_equals_the_torch_amp_loop(hw, ht, clip_first):
    trainer, scaler, scales = train(hw, ht, clip_first=clip_first)
    model, hand_scales, hand_skipped, _ = hand_loop(clip=clip_first is not None)
    assert BAD_STEP in hand_skipped  # the overflowing batch: its step skipped, the scale backed off
    assert scaler.skipped == hand_skipped
    assert scales == hand_scales and len(set(scales)) > 2  # backed off and grown again
    assert all_equal(params(trainer.model), params(model))  # bit for bit
    assert scaler.calls == STEPS
    # The loss the loop computed is unscaled: only backward's argument was scaled.
    assert trainer.losses[0] < 10
    # The rest of the loop's optimizer_step ran on the skipped step too (the scheduler).
    assert trainer.scheduler.last_epoch == STEPS
    # and the optimizer's step is the scheduler's wrapper again, as before the run.
    assert getattr(vars(trainer.optimizer)["step"], "_wrapped_by_lr_sched", False)


def test_grad_clip_sees_unscaled_gradients(hw, ht):
    """Clipping the scaled gradients would clip to max_norm * scale: the weights
    would differ from the hand loop's; and the norm after clipping is <= max_norm."""
    norms: list[float] = []
    trainer = make_trainer(hw)
    trainer.add_callback(ht.GradClip(MAX_NORM))
    trainer.add_callback(ht.GradScaler("cpu", **SCALER))
    trainer.after("backward", lambda self: norms.append(float(torch.nn.utils.get_total_norm(
        [p.grad for p in self.model.parameters()]))))
    trainer.fit(0, 2)
    assert all(norm <= MAX_NORM * 1.0001 for norm in norms), norms


def test_the_scale_and_skips_resume_from_callback_state(hw, ht):
    trainer, scaler, _ = train(hw, ht, steps=5)
    buffer = io.BytesIO()
    torch.save(hw.callback_state(trainer), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert saved["GradScaler[event=optimizer_step]"]["scaler"] == scaler.scaler.state_dict()

    resumed = make_trainer(hw)
    resumed.model.load_state_dict(trainer.model.state_dict())
    resumed.optimizer.load_state_dict(trainer.optimizer.state_dict())
    resumed.scheduler.load_state_dict(trainer.scheduler.state_dict())
    resumed.add_callback(ht.Autocast(events="forward", dtype=torch.float16))
    again = ht.GradScaler("cpu")  # other settings: the saved ones win, as torch's load_state_dict does
    resumed.add_callback(again)
    resumed.add_callback(ht.GradClip(MAX_NORM))
    hw.load_callback_state(resumed, saved)
    scales: list[float] = []
    resumed.after("step", lambda self: scales.append(again.scaler.get_scale()))
    resumed.fit(5, STEPS)

    model, hand_scales, hand_skipped, _ = hand_loop()
    assert again.skipped == hand_skipped and again.calls == STEPS
    assert scales == hand_scales[5:]
    assert all_equal(params(resumed.model), params(model))


def test_on_the_torch_optim_preset_the_optimizer_step_is_what_is_skipped(hw, ht):
    """weave_optimizers(): the optimizer's own step is the join point; the loop scales
    its loss itself (backward_event=None)."""
    preset = importlib.import_module("hookwrap.integrations.torch_optim")
    weights, scales = [], []
    with preset.weave_optimizers():
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        scaler = ht.GradScaler("cpu", event="step", backward_event=None, optimizer=optimizer, **SCALER)
        handle = hw.add_callback(torch.optim.SGD, scaler)
        try:
            for x, y in make_data():
                with torch.autocast("cpu", dtype=torch.float16):
                    out = model(x)
                scaler.scale(torch.nn.functional.mse_loss(out.float(), y)).backward()
                scaler.unscale()  # before clipping, as the hand loop does
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
                optimizer.step()
                optimizer.zero_grad()
                scales.append(scaler.scaler.get_scale())
            weights = params(model)
        finally:
            handle.remove()
    hand_model, hand_scales, hand_skipped, _ = hand_loop(schedule=False)
    assert BAD_STEP in hand_skipped and scaler.skipped == hand_skipped
    assert scales == hand_scales and all_equal(weights, params(hand_model))


def test_a_skipped_step_is_logged_at_info(hw, ht, caplog):
    with caplog.at_level("INFO", logger="hookwrap"):
        _, scaler, _ = train(hw, ht, steps=BAD_STEP)
    assert f"optimizer step {BAD_STEP} skipped" in caplog.text and BAD_STEP in scaler.skipped


@pytest.mark.parametrize("kwargs, message", [
    ({"device": "gpu0"}, "device must be a device type torch.amp.GradScaler supports"),
    ({"device": 3}, "device must be a device type"),
    ({"device": "cpu", "event": ""}, "event must be a join point name"),
    ({"device": "cpu", "backward_event": ""}, "backward_event must be a join point name or None"),
    ({"device": "cpu", "optimizer": None}, "optimizer must be the name of the attribute"),
    ({"scaler": "yes"}, "scaler must be a torch.amp.GradScaler"),
    ({"scaler": "disabled"}, "is disabled"),
])
def test_grad_scaler_refuses_bad_input(hw, ht, kwargs, message):
    if kwargs.get("scaler") == "disabled":
        kwargs = {"scaler": torch.amp.GradScaler("cpu", enabled=False)}
    with pytest.raises(hw.HookError, match=message):
        ht.GradScaler(**kwargs)


def test_grad_scaler_refuses_cuda_without_it_and_a_missing_event(hw, ht):
    if not torch.cuda.is_available():
        with pytest.raises(hw.HookError, match="CUDA is not available"):
            ht.GradScaler()
    with pytest.raises(hw.UnknownEventError, match="optimizer_stepp"):
        make_trainer(hw).add_callback(ht.GradScaler("cpu", event="optimizer_stepp"))
    with pytest.raises(hw.CallbackSignatureError, match=r"has no argument 'loss' to scale .*backward_event=None"):
        make_trainer(hw).add_callback(ht.GradScaler("cpu", backward_event="forward"))


def test_a_loop_that_never_steps_leaves_the_scaler_alone(hw, ht):
    """GradAccumulation outside it skips the optimizer_step calls between updates:
    the scaler steps (and updates) only on those that run."""
    trainer = make_trainer(hw)
    trainer.add_callback(ht.GradAccumulation(2))
    scaler = ht.GradScaler("cpu", **SCALER)
    trainer.add_callback(scaler)
    trainer.fit(0, 3)
    assert scaler.calls == 1 and scaler.skipped == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_float16_with_grad_scaler_equals_the_torch_amp_loop_on_cuda(hw, ht):
    trainer, scaler, scales = train(hw, ht, device="cuda")
    model, hand_scales, hand_skipped, _ = hand_loop(device="cuda")
    assert BAD_STEP in hand_skipped and scaler.skipped == hand_skipped
    assert scales == hand_scales
    assert all_equal(params(trainer.model), params(model))


# --- GradNorm beside GradScaler: the true (unscaled) norm, as torch.amp, HF and Lightning log it


def hand_norms(clip: str | None = None, accumulate: int = 1) -> tuple[Any, list[Any], list[int]]:
    """The torch.amp loop written out, the norm logged where transformers and
    Lightning log it: after ``scaler.unscale_``, before clipping (``clip="after"``:
    the norm of the clipped gradients, GradNorm attached after GradClip); with
    ``accumulate`` > 1, the norm of the gradients summed so far after every backward
    (divided by the scale on the backwards that do not step, unscaled on those that
    do). Returns the model, the norms, the steps skipped."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", **SCALER)
    norms, skipped = [], []
    for i, (x, y) in enumerate(make_data(), start=1):
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y) / accumulate
        scaler.scale(loss).backward()
        if i % accumulate:
            grads = [p.grad / scaler.get_scale() for p in model.parameters()]
            norms.append(torch.nn.utils.get_total_norm(grads))
            continue
        scaler.unscale_(optimizer)
        if clip is None:
            norms.append(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
        else:
            before = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)  # HF's grad_norm
            after = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            norms.append(before if clip == "before" else after)
        if sum(v.item() for v in scaler._found_inf_per_device(optimizer).values()):
            skipped.append(i)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        scheduler.step()
    return model, norms, skipped


def same_norms(logged: list[tuple[int, float]], hand: list[Any]) -> bool:
    return [step for step, _ in logged] == list(range(1, len(hand) + 1)) and torch.allclose(
        torch.tensor([norm for _, norm in logged], dtype=torch.float64), torch.stack(hand).double(),
        rtol=1e-6, atol=0.0, equal_nan=True)


@pytest.mark.parametrize("clip", [None, "before", "after"], ids=["no-clip", "norm-then-clip", "clip-then-norm"])
def test_grad_norm_beside_grad_scaler_is_the_unscaled_norm(hw, ht, clip):
    """The norms GradNorm logs are those of the hand loop's unscaled gradients, step by
    step; on the step the scaler skips, the same non-finite norm (``clip_grad_norm_``'s
    return value there, which transformers logs; Lightning's ``grad_norm`` in
    ``on_before_optimizer_step``, after ``unscale_``, too). The weights stay bit for bit."""
    trainer = make_trainer(hw)
    trainer.add_callback(ht.Autocast(events="forward", dtype=torch.float16))
    norm, clipper = ht.GradNorm(), ht.GradClip(MAX_NORM)
    for cb in {None: [norm], "before": [norm, clipper], "after": [clipper, norm]}[clip]:
        trainer.add_callback(cb)
    scaler = ht.GradScaler("cpu", **SCALER)
    trainer.add_callback(scaler)
    trainer.fit(0, STEPS)
    model, hand, skipped = hand_norms(clip)
    assert BAD_STEP in skipped and scaler.skipped == skipped
    assert same_norms(norm.history, hand), (norm.history, hand)
    assert not torch.isfinite(hand[BAD_STEP - 1]) and all(torch.isfinite(n) for n in hand[BAD_STEP:])
    assert max(n for _, n in norm.history[BAD_STEP:]) < 100  # not the scaled norm (x 2**11 and more)
    if clip == "after":
        assert all(n <= MAX_NORM * 1.0001 for _, n in norm.history[BAD_STEP:])
    assert all_equal(params(trainer.model), params(model if clip else hand_loop(clip=False)[0]))


def test_grad_norm_beside_grad_scaler_and_accumulation_unscales_nothing_early(hw, ht):
    """With GradAccumulation(2), GradNorm after every backward: the norm of the
    gradients summed so far, divided by the scale where they are not unscaled yet;
    unscale_ still runs once per optimizer step (the weights are the hand loop's)."""
    trainer = make_trainer(hw)
    trainer.add_callback(ht.GradAccumulation(2, clip_grad_norm=MAX_NORM))  # unscales once, before the step
    trainer.add_callback(ht.Autocast(events="forward", dtype=torch.float16))
    norm, scaler = ht.GradNorm(), ht.GradScaler("cpu", **SCALER)
    trainer.add_callback(norm)
    trainer.add_callback(scaler)
    trainer.fit(0, STEPS)
    model, hand, skipped = hand_norms(clip="before", accumulate=2)
    assert same_norms(norm.history, hand), (norm.history, hand)
    assert BAD_STEP in skipped and scaler.skipped == [BAD_STEP // 2] and scaler.calls == STEPS // 2
    assert all_equal(params(trainer.model), params(model))


def test_grad_clip_after_every_backward_under_accumulation_is_refused(hw, ht):
    """GradClip unscales the gradients after the first backward of a step; with
    GradAccumulation the next backward would add scaled gradients to unscaled ones and
    the step would mix both scales. Refused at that backward, naming the fix."""
    trainer = make_trainer(hw)
    trainer.add_callback(ht.GradAccumulation(2))
    trainer.add_callback(ht.Autocast(events="forward", dtype=torch.float16))
    trainer.add_callback(ht.GradClip(MAX_NORM))
    trainer.add_callback(ht.GradScaler("cpu", **SCALER))
    with pytest.raises(hw.HookError, match=r"would add to the unscaled ones.*clip_grad_norm"):
        trainer.fit(0, STEPS)


def test_a_scale_a_run_left_due_is_no_other_loops(ht):
    """A run that ended between its backward and its step leaves its scaler due (a
    test's trainer raised, a notebook cell was stopped). Loops made after it, one of
    them perhaps at the address the old loop had once collected, are not scaled by
    it: their GradNorm divides by nothing, and clipping there unscales nothing of
    the old scaler's (CI found a first norm divided by 2**12 when a later test's
    trainer took a collected one's address)."""
    from hookwrap.torch.grad_scaler import scale_of_gradients, unscale_before_clipping

    class Loop:
        def __init__(self) -> None:
            self.optimizer = torch.optim.SGD(make_model().parameters(), lr=LR)

    stale = ht.GradScaler("cpu", **SCALER)
    loop = Loop()
    stale.scale(torch.ones(()), loop)
    assert scale_of_gradients(loop) is stale.scaler._scale
    del loop
    for _ in range(200):  # CPython hands a freed object's address to the next of its size
        new = Loop()
        assert scale_of_gradients(new) is None
        unscale_before_clipping(new)
        assert stale._unscaled is None
        del new
