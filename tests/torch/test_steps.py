"""What a step is (hookwrap.torch.steps): a loop of the user's own that accumulates
gradients declares that a step is an update, and every counting callback numbers in
updates; a saved state says which axis it counts on, and a state counted otherwise
is refused. The frameworks' presets declare the same (tests/integrations)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's NumPy notice

ACCUMULATE = 4


@pytest.fixture(autouse=True)
def _declared_loops_gone():
    """The loops a test declares are collected when it ends: the global tier of a later
    test finds no update axis of theirs."""
    import gc

    yield
    gc.collect()


def accumulating_loop(hw, losses=(), scores=(), counter=False):
    """A loop accumulating ACCUMULATE batches an update, as a hand-written one does."""

    class Loop(hw.Hookable):
        def __init__(self):
            torch.manual_seed(0)
            self.model = torch.nn.Linear(2, 1)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            self.losses, self.scores = iter(losses), iter(scores)
            self.updates = 0

        @hw.hookable
        def fit(self, batches: int, evaluate_every: int = 0, first: int = 0) -> None:
            for i in range(first + 1, batches + 1):  # batch i: the same data wherever the run starts
                self.step(torch.ones(4, 2) * (i % 5) - torch.arange(2.0) * i / 7)
                if i % ACCUMULATE == 0:
                    self.optimizer_step()
                    if evaluate_every and self.updates % evaluate_every == 0:
                        self.evaluate()

        @hw.hookable
        def step(self, batch):
            out = self.model(batch).mean()
            loss = self.loss(out - out.detach() + next(self.losses, 1.0))
            self.backward(loss / ACCUMULATE)
            return loss.detach()

        @hw.hookable
        def backward(self, loss):
            loss.backward()

        @hw.hookable
        def loss(self, value):
            return value

        @hw.hookable
        def optimizer_step(self) -> None:
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.updates += 1

        @hw.hookable
        def evaluate(self) -> dict:
            return {"val_loss": next(self.scores)}

    return Loop


def test_a_declared_loop_counts_updates_in_every_counting_callback(hw, ht, tmp_path):
    Loop = accumulating_loop(hw, losses=[1.0] * 8 + [2.0] * 4 + [3.0] * 4, scores=[3.0, 1.0, 2.0, 2.5])
    ht.counts_updates(Loop, "optimizer_step", opens="step")
    loop = Loop()
    every = ht.Checkpoint(tmp_path / "ck", every_n_steps=3, model="model")
    early = ht.EarlyStopping("val_loss", patience=10)
    log = ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False)
    grads, lrs = ht.GradNorm(logger=log), ht.LRMonitor(logger=log)
    for cb in (every, early, log, grads, lrs):
        loop.add_callback(cb)
    loop.fit(8 * ACCUMULATE, evaluate_every=2)
    assert loop.updates == 8 and early.step == 8 and early.best_step == 4
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["last.pt", "step=3.pt", "step=6.pt"]
    rows = log.read()
    loss_rows = [(step, value) for step, name, value in rows if name == "loss"]
    assert loss_rows == [(1, 1.0), (2, 1.0), (3, 2.0), (4, 3.0), (5, 1.0), (6, 1.0), (7, 1.0), (8, 1.0)]
    assert [step for step, name, _ in rows if name == "grad_norm"] == list(range(1, 9))  # one per update
    assert [step for step, name, _ in rows if name == "val_loss"] == [2, 4, 6, 8]
    assert [step for step, _ in lrs.history] == [1]  # recorded when it changes: the first update's


def test_undeclared_the_same_loop_counts_batches(hw, ht):
    """Without the declaration a step is a call of step, as the docs say of a loop of
    one's own: the two axes differ by the accumulation."""
    loop = accumulating_loop(hw)()
    early = ht.EarlyStopping("return_value", event="loss", patience=100)
    loop.add_callback(early)
    loop.fit(2 * ACCUMULATE)
    assert early.step == 2 * ACCUMULATE and "step_axis" not in early.state_dict()


def test_a_state_counted_on_another_axis_is_refused(hw, ht):
    Loop = accumulating_loop(hw, scores=[1.0] * 4)
    ht.counts_updates(Loop, "optimizer_step", opens="step")
    counted_in_updates = ht.EarlyStopping("val_loss")
    Loop().add_callback(counted_in_updates)
    state = counted_in_updates.state_dict()
    assert state["step_axis"] == "updates"
    plain = accumulating_loop(hw)()
    other = ht.EarlyStopping("val_loss", event="loss")
    plain.add_callback(other)
    with pytest.raises(TypeError, match=r"counts its steps in optimizer updates.*counts calls of 'step'"):
        other.load_state_dict(state)
    # Loaded before it is attached: refused where it is attached.
    fresh = ht.EarlyStopping("val_loss")
    fresh.load_state_dict({"step": 3, "best": None, "best_step": 0, "wait": 0})  # saved counting batches
    with pytest.raises(hw.HookError, match=r"counts its steps in calls of 'step' \(batches\).*optimizer updates"):
        Loop().add_callback(fresh)
    with pytest.raises(TypeError, match="'step_axis' must be 'updates' or absent"):
        ht.EarlyStopping("val_loss").load_state_dict({**state, "step_axis": "epochs"})


def test_a_framework_counter_is_the_step_when_an_update_opens(hw, ht):
    """counter=: the loop's own count of updates done, read when an update opens, so a
    callback attached to a resumed loop numbers on from it."""
    Loop = accumulating_loop(hw, scores=[1.0, 0.5])
    ht.counts_updates(Loop, "optimizer_step", opens="step", counter=lambda loop: loop.updates)
    loop = Loop()
    loop.updates = 10  # resumed at update 10
    early = ht.EarlyStopping("val_loss")
    loop.add_callback(early)
    loop.fit(2 * ACCUMULATE, evaluate_every=1)
    assert early.step == 12 and early.best_step == 12


def test_counts_updates_refuses_what_cannot_work(hw, ht):
    Loop = accumulating_loop(hw)
    with pytest.raises(hw.UnknownEventError, match="optimiser_step"):
        ht.counts_updates(Loop, "optimiser_step")
    with pytest.raises(hw.HookError, match="pass the class of the loop"):
        ht.counts_updates(Loop(), "optimizer_step")
    with pytest.raises(hw.HookError, match="counter must be a function"):
        ht.counts_updates(Loop, "optimizer_step", counter=3)


def signalled_run(hw, ht, folder, declared, signal_at=None, start=None):
    """The accumulating loop with a momentum optimizer and Checkpoint(on_signal=SIGUSR1);
    SIGUSR1 lands after batch ``signal_at`` (a Python handler lets the run go on once
    it is saved); with ``start``, resumed from signal.pt first. Its final weights."""
    import signal

    Loop = accumulating_loop(hw)
    if declared:
        ht.counts_updates(Loop, "optimizer_step", opens="step")
    loop = Loop()
    loop.optimizer = torch.optim.SGD(loop.model.parameters(), lr=0.05, momentum=0.9)
    checkpoint = ht.Checkpoint(folder, on_signal="SIGUSR1")
    loop.add_callback(checkpoint)
    if signal_at is not None:
        hw.after(loop, "step", lambda self: signal.raise_signal(signal.SIGUSR1)
                 if checkpoint.step and loop.batches == signal_at else None)
    loop.batches = 0
    hw.before(loop, "step", lambda self: setattr(self, "batches", self.batches + 1))
    first = 0
    if start is not None:
        state = checkpoint.resume(loop, "signal")
        first = state["step"] * (ACCUMULATE if declared else 1)
        loop.updates = first // ACCUMULATE
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: None)  # the run goes on once saved
    try:
        loop.fit(6 * ACCUMULATE, first=first)
    finally:
        signal.signal(signal.SIGUSR1, old)
    return torch.cat([p.detach().flatten() for p in loop.model.parameters()])


def test_a_signal_mid_update_saves_at_the_update_boundary_and_resumes_to_the_same_weights(hw, ht, tmp_path):
    """SIGUSR1 after batch 10, in the middle of update 3 (batches 9 to 12): on a loop that
    counts updates the save waits for the update to end, so signal.pt holds update 3 whole
    (its accumulated gradients applied) and a resume from it reaches the weights of the
    run that never stopped. Counting calls of step, the save holds half an update."""
    straight = signalled_run(hw, ht, tmp_path / "straight", declared=True)
    signalled_run(hw, ht, tmp_path / "run", declared=True, signal_at=10)
    assert torch.load(tmp_path / "run" / "signal.pt", weights_only=True)["step"] == 3
    assert torch.equal(signalled_run(hw, ht, tmp_path / "run", declared=True, start=True), straight)
    signalled_run(hw, ht, tmp_path / "calls", declared=False, signal_at=10)
    # Saved after the next call of step (the signal came after Checkpoint's own after-step): mid-update.
    assert torch.load(tmp_path / "calls" / "signal.pt", weights_only=True)["step"] == 11
    assert not torch.equal(signalled_run(hw, ht, tmp_path / "calls", declared=False, start=True), straight)


def test_a_callback_that_would_number_every_row_0_says_so_once(hw, ht, tmp_path):
    """A loop with a loss but no step event: nothing counts steps, so every row would be
    step 0. MetricsLogger says so at its first row, naming the setting, once."""

    class NoSteps(hw.Hookable):
        @hw.hookable
        def fit(self) -> None:
            for value in (3.0, 2.0, 1.0):
                self.loss(value)

        @hw.hookable
        def loss(self, value: float) -> float:
            return value

    loop = NoSteps()
    log = ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False)
    loop.add_callback(log)
    with pytest.warns(hw.HookwrapWarning, match=r"NoSteps has no join point 'step'.*step 0.*step_event=") as said:
        loop.fit()
    assert len([w for w in said if "step 0" in str(w.message)]) == 1
    assert [(step, value) for step, _, value in log.read()] == [(0, 3.0), (0, 2.0), (0, 1.0)]  # logged all the same
    counted = ht.MetricsLogger(tmp_path / "n.csv", tensorboard=False, step_event="fit")  # a step named: no word
    loop2 = NoSteps()
    loop2.add_callback(counted)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loop2.fit()
    assert {step for step, _, _ in counted.read()} == {1}


def test_an_update_a_raising_run_left_open_ends_with_it(hw, ht):
    """Batch 3 (update 2 of 2-batch updates... here 4) raises: the next fit starts its
    first update afresh, numbered on from the last one started."""
    Loop = accumulating_loop(hw)
    ht.counts_updates(Loop, "optimizer_step", opens="step")
    loop = Loop()
    early = ht.EarlyStopping("val_loss")
    loop.add_callback(early)
    calls = []

    def fail_once(self):
        calls.append(1)
        if len(calls) == ACCUMULATE + 2:  # in update 2
            raise RuntimeError("a batch failed")

    hw.before(loop, "step", fail_once)
    with pytest.raises(RuntimeError, match="a batch failed"):
        loop.fit(4 * ACCUMULATE)
    assert early.step == 2
    loop.fit(2 * ACCUMULATE)  # two updates more: 3 and 4
    assert early.step == 4


def test_the_global_tier_counts_each_loop_on_its_own_axis(hw, ht):
    """A global callback reaches a loop that counts updates and one that counts its
    calls of step: each is numbered as its class says."""
    Declared = accumulating_loop(hw)
    ht.counts_updates(Declared, "optimizer_step", opens="step")
    Plain = accumulating_loop(hw)
    early = ht.EarlyStopping("val_loss")
    with early:
        Declared().fit(2 * ACCUMULATE)
        assert early.step == 2
        Plain().fit(3)  # 3 calls of step
        assert early.step == 5


def test_one_callback_counts_one_axis(hw, ht):
    Declared = accumulating_loop(hw)
    ht.counts_updates(Declared, "optimizer_step", opens="step")
    early = ht.EarlyStopping("val_loss")
    Declared().add_callback(early)
    with pytest.raises(hw.HookError, match="one callback numbers one axis"):
        accumulating_loop(hw)().add_callback(early)


def test_a_callback_on_a_loop_with_a_counter_function_pickles(hw, ht, tmp_path):
    import pickle

    Loop = accumulating_loop(hw, scores=[1.0])
    ht.counts_updates(Loop, "optimizer_step", opens="step", counter=lambda loop: loop.updates)
    loop = Loop()
    early = ht.EarlyStopping("val_loss")
    loop.add_callback(early)
    loop.fit(2 * ACCUMULATE)
    copy = pickle.loads(pickle.dumps(early))
    assert copy.state_dict() == early.state_dict() == {"step": 2, "step_axis": "updates", "best": None,
                                                       "best_step": 0, "wait": 0}


def test_a_state_counted_in_batches_loads_where_the_loop_keeps_the_count(hw, ht):
    """Saved by an earlier hookwrap, which counted batches on a framework: where the
    framework keeps the count of updates (counter=), it is loaded with a warning, and
    the step follows the framework's count from the next update."""
    Loop = accumulating_loop(hw)
    ht.counts_updates(Loop, "optimizer_step", opens="step", counter=lambda loop: loop.updates)
    loop = Loop()
    loop.updates = 3  # resumed at update 3
    early = ht.EarlyStopping("val_loss")
    loop.add_callback(early)
    with pytest.warns(hw.HookwrapWarning, match="counts its steps in calls of 'step'.*earlier hookwrap"):
        early.load_state_dict({"step": 12, "best": 1.0, "best_step": 8, "wait": 1})
    loop.fit(ACCUMULATE)
    assert early.step == 4 and early.best_step == 8 and early.wait == 1


def test_a_removed_weave_leaves_no_update_axis_for_the_global_tier(hw, ht):
    """A preset's loop, woven and declared to count updates, then its weave removed:
    its join points, though not yet collected (a cycle holds them), no longer give
    the global tier an update axis (a GradNorm on another loop's `step` then waited
    for an update that never came, and logged nothing)."""
    from hookwrap.torch.steps import update_axes

    class Loop:
        def step(self) -> None:
            self.optimizer_step()

        def optimizer_step(self) -> None:
            pass

    Loop.cycle = Loop  # type: ignore[attr-defined]  # kept alive until a full collection
    handle = hw.weave(Loop, "step", "optimizer_step")
    ht.counts_updates(Loop, "optimizer_step")
    assert [axis.update for axis in update_axes(None)] == ["optimizer_step"]
    handle.remove()
    assert update_axes(None) == []
