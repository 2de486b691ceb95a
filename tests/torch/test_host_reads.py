"""No host sync per step: the shipped callbacks queue device values and read them
back together, rarely (hookwrap.torch.readback).

Host reads are counted, never timed: ``count_host_reads`` patches the tensor
methods that hand values to Python (``.item()``, ``.tolist()``, ``float()``, ...),
so a CPU run counts what a CUDA run would wait for.
"""

from __future__ import annotations

import io
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra")
pytest.importorskip("tqdm", reason="needs the torch extra (tqdm)")

STEPS_PER_EPOCH, EPOCHS = 20, 5  # 100 steps
TARGET_STEPS_PER_READ = 10  # at most one host read per 10 steps, amortised


def tiny_loop(hw: Any, device: str = "cpu", nan_at: int | None = None,
              steps_per_epoch: int = STEPS_PER_EPOCH) -> Any:
    """The example trainer's join points around a tiny model, on SGD (which reads
    nothing back), evaluating to Python floats: every read counted is a callback's."""

    class Tiny(hw.Hookable):
        def __init__(self) -> None:
            gen = torch.Generator().manual_seed(0)
            self.model = torch.nn.Linear(4, 2).to(device)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
            self.batches = [(torch.randn(8, 4, generator=gen).to(device),
                             torch.randint(0, 2, (8,), generator=gen).to(device))
                            for _ in range(steps_per_epoch)]
            self.steps = 0
            self.losses: list[Any] = []
            self.val_loss = 1.0
            self.stop_reason: str | None = None

        @hw.hookable
        def fit(self, epochs: int) -> None:
            try:
                for index in range(epochs):
                    self.epoch(index)
                    self.evaluate()
            except hw.StopTraining as stop:
                self.stop_reason = str(stop)

        @hw.hookable
        def epoch(self, index: int) -> None:
            for batch in self.batches:
                self.step(batch)

        @hw.hookable
        def step(self, batch: Any) -> Any:
            self.steps += 1
            inputs, targets = batch
            loss = self.loss(self.model(inputs), targets)
            self.backward(loss)
            self.optimizer_step()
            return loss.detach()

        @hw.hookable
        def loss(self, logits: Any, targets: Any) -> Any:
            loss = torch.nn.functional.cross_entropy(logits, targets)
            if nan_at is not None and self.steps >= nan_at:
                loss = loss * math.nan
            self.losses.append(loss.detach())
            return loss

        @hw.hookable
        def backward(self, loss: Any) -> None:
            loss.backward()

        @hw.hookable
        def optimizer_step(self) -> None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

        @hw.hookable
        def evaluate(self) -> dict[str, float]:
            self.val_loss *= 0.9  # improving: the run goes on
            return {"val_loss": self.val_loss}

    return Tiny()


def run_with_demo_set(hw: Any, tmp_path: Any, device: str = "cpu", **loop: Any) -> tuple[Any, Any, Any]:
    from hookwrap.demo import callback_set
    from hookwrap.torch import count_host_reads

    trainer = tiny_loop(hw, device, **loop)
    callbacks, bar = callback_set(tmp_path, device, total=len(trainer.batches), stream=io.StringIO())
    for callback in callbacks:
        trainer.add_callback(callback)
    with count_host_reads() as reads, bar:
        trainer.fit(EPOCHS)
    return trainer, reads, (callbacks, bar)


def test_the_loop_alone_reads_nothing_back(hw, tmp_path):
    from hookwrap.torch import count_host_reads

    trainer = tiny_loop(hw)
    with count_host_reads() as reads:
        trainer.fit(EPOCHS)
    assert trainer.steps == 100 and reads.count == 0, reads


def test_the_demo_set_reads_back_at_most_once_per_10_steps(hw, tmp_path):
    trainer, reads, (callbacks, bar) = run_with_demo_set(hw, tmp_path)
    assert trainer.steps == STEPS_PER_EPOCH * EPOCHS == 100
    # Before: NanGuard read each loss, the logger every 10th, the bar every 10th
    # step, GradNorm every 50th (1.22 reads per step here). Now one .tolist() of
    # everything queued per NanGuard read-back: here once per epoch.
    assert reads.count <= trainer.steps // TARGET_STEPS_PER_READ, reads
    assert reads.count == EPOCHS and reads.by_method == {"tolist": EPOCHS}
    guard, _, _, _, grad_norm, _, throughput, log = callbacks
    assert guard.checked == 100
    # Every value still arrives, each at its step.
    assert grad_norm.history == [(50, pytest.approx(grad_norm.history[0][1])),
                                 (100, pytest.approx(grad_norm.history[1][1]))]
    logged = [(step, value) for step, name, value in log.read() if name == "loss"]
    assert logged == [(s, pytest.approx(float(trainer.losses[s - 1]))) for s in range(10, 101, 10)]
    assert bar.loss == pytest.approx(float(trainer.losses[90]))  # the last loss it queued (step 91)
    assert [step for step, _ in throughput.history] == [50, 100]  # counted from shapes: no read


def test_the_demo_set_on_a_long_epoch_still_meets_the_target(hw, tmp_path):
    """One epoch of 100 steps: NanGuard's read-backs every 20 checks carry the rest."""
    trainer, reads, _ = run_with_demo_set(hw, tmp_path, steps_per_epoch=100)
    assert trainer.steps == 500
    assert reads.count <= trainer.steps // TARGET_STEPS_PER_READ, reads


def test_nan_guard_in_the_demo_set_names_the_first_bad_step(hw, ht, tmp_path):
    with pytest.raises(ht.NonFiniteError, match=r"returned nan at step 23 \(Tiny\)\. Stopping") as raised:
        run_with_demo_set(hw, tmp_path, nan_at=23)
    assert "NanGuard.end_of_epoch" in "".join(getattr(raised.value, "__notes__", []))


@pytest.mark.parametrize("sync", [False, True])
def test_nan_guard_deferred_and_exact(hw, ht, sync):
    trainer = tiny_loop(hw, nan_at=23)
    guard = ht.NanGuard(sync=sync)
    trainer.add_callback(guard)
    with ht.count_host_reads() as reads:
        with pytest.raises(ht.NonFiniteError, match=r"returned nan at step 23 \(Tiny\)\. Stopping"):
            trainer.fit(EPOCHS)
    if sync:  # one read per check, stopped in the bad step
        assert (trainer.steps, reads.count) == (23, 23)
    else:  # read back at the end of epoch 1 and before step 41: at most check_every - 1 late
        assert (trainer.steps, reads.count) == (40, 2)


@pytest.mark.parametrize("steps", [1, 7, 19])
def test_a_nan_in_the_last_steps_is_found_when_fit_ends(hw, ht, steps):
    trainer = tiny_loop(hw, nan_at=steps, steps_per_epoch=steps)
    guard = ht.NanGuard(epoch_event=None)  # only fit's end reads it back
    trainer.add_callback(guard)
    with pytest.raises(ht.NonFiniteError, match=rf"returned nan at step {steps} \(Tiny\)"):
        trainer.fit(1)
    assert trainer.steps == steps


def test_a_function_loop_reads_every_check_every_calls_not_each_call(hw, ht):
    """No step event and no fit: the checks are read every ``check_every`` (in the
    check), never once per call (issue 41: a read, a device sync on CUDA, per step);
    what the last calls queued is decided at an ending (here the block's end)."""
    from hookwrap.extend import boundary

    @hw.hookable
    def compute_loss(x: Any) -> Any:
        return x.sum()

    guard = ht.NanGuard(events="compute_loss", check_every=3)
    handle = hw.add_callback(compute_loss, guard)
    try:
        with ht.count_host_reads() as reads:
            compute_loss(torch.ones(2))
            compute_loss(torch.full((2,), math.inf))
            assert reads.count == 0  # two checks queued, none read
            with pytest.raises(ht.NonFiniteError, match="returned inf before any step was counted"):
                compute_loss(torch.ones(2))  # the third: read in the check
        assert guard.checked == 3 and reads.count == 1
        with ht.count_host_reads() as reads:
            with pytest.raises(ht.NonFiniteError, match="returned inf before any step was counted"), boundary():
                compute_loss(torch.ones(2))
                compute_loss(torch.full((2,), math.inf))  # fewer than check_every: at the block's end
        assert guard.checked == 5 and reads.count == 1
    finally:
        handle.remove()


def test_a_larger_tensor_names_its_first_bad_element(hw, ht):
    @hw.hookable
    def outputs(x: Any) -> Any:
        return x

    guard = ht.NanGuard(events="outputs", check_every=2)
    handle = hw.add_callback(outputs, guard)
    try:
        outputs({"ok": torch.ones(3), "n": torch.arange(3)})
        with pytest.raises(ht.NonFiniteError, match=r"returned -inf\['logits'\] \(an element\)"):
            outputs({"logits": torch.tensor([1.0, -math.inf, math.nan])})
    finally:
        handle.remove()


def test_plain_numbers_are_checked_at_once_after_the_queued_tensors(hw, ht):
    from hookwrap.extend import boundary

    @hw.hookable
    def step(loss: Any) -> Any:
        return loss

    guard = ht.NanGuard(events="step")
    handle = hw.add_callback(step, guard)
    try:
        with boundary():  # calls that defer to the block's end (a script's)
            step(0.5)
            with pytest.raises(ht.NonFiniteError, match="was nan at step 2"):
                step(math.nan)  # a number: at once, as before
            step(torch.tensor(math.inf))  # queued: step 3
            with pytest.raises(ht.NonFiniteError, match="was inf at step 3"):
                step(math.nan)  # the tensor before it went bad first
        step(torch.tensor(math.inf))  # outside the block: queued, decided at an ending
        with pytest.raises(ht.NonFiniteError, match="was inf at step 5"):
            hw.callback_state(step)  # (one: the state a checkpoint takes)
    finally:
        handle.remove()


def test_the_progress_bar_reads_its_loss_itself_when_nothing_else_does(hw, ht):
    trainer = tiny_loop(hw, steps_per_epoch=250)
    bar = ht.ProgressBar(total=250, file=io.StringIO(), read_every=100)
    trainer.add_callback(bar)
    with ht.count_host_reads() as reads:
        trainer.fit(1)
    # Queued every 10 losses; read after 100 steps of waiting (steps 101, 201) and
    # when the epoch ends.
    assert reads.count == 3
    assert bar.loss == pytest.approx(float(trainer.losses[240]))


def test_read_back_delivers_cpu_values_in_one_read(ht):
    reader = ht.ReadBack()
    got: list[Any] = []
    reader.put(torch.tensor(1.5), got.append)
    reader.put(torch.tensor([2, 3]), got.append)
    assert reader.pending == 2 and got == []
    with ht.count_host_reads() as reads:
        reader.read()
    assert got == [[1.5], [2.0, 3.0]] and reader.pending == 0 and reads.count == 1
    reader.read()  # nothing queued: no read
    assert reader.reads == 1


def test_a_queue_nobody_reads_is_read_when_it_is_full(ht):
    reader = ht.ReadBack()
    reader.max_queued = 4
    got: list[Any] = []
    for value in range(9):
        reader.put(torch.tensor(float(value)), got.append)
    assert got == [[0.0], [1.0], [2.0], [3.0], [4.0], [5.0], [6.0], [7.0]]
    assert reader.pending == 1 and reader.reads == 2


def test_count_host_reads_restores_the_tensor_methods(ht):
    before = {name: torch.Tensor.__dict__.get(name) for name in ("item", "tolist", "__float__")}
    with ht.count_host_reads() as reads:
        torch.ones(1).item()
        float(torch.ones(1))
        torch.ones(2).tolist()
    assert reads.by_method == {"item": 1, "__float__": 1, "tolist": 1}
    assert {name: torch.Tensor.__dict__.get(name) for name in before} == before


# --- CUDA: run where it exists -----------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (none on this machine)")


@cuda
def test_cuda_read_back_is_asynchronous(ht):
    reader = ht.ReadBack()
    got: list[Any] = []
    value = torch.full((1,), 2.5, device="cuda")
    torch.cuda._sleep(50_000_000)  # keep the stream busy: the copy cannot be done yet
    reader.put(value, got.append)
    reader.read()  # starts the copy, does not wait for it
    assert got == [] and reader.pending == 1
    reader.read(wait=True)
    assert got == [[2.5]] and reader.pending == 0


@cuda
def test_cuda_demo_set_never_syncs_in_the_loop(hw, tmp_path):
    """Under sync debug mode "error" any implicit device sync in a step raises. Two
    epochs (their ends read back too, without waiting); the one wait, at the end of
    the run, comes after (check_pending)."""
    from hookwrap.demo import callback_set

    trainer = tiny_loop(hw, "cuda")
    callbacks, bar = callback_set(tmp_path, "cuda", total=len(trainer.batches), stream=io.StringIO())
    for callback in callbacks:
        trainer.add_callback(callback)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with bar:
            trainer.epoch(0)
            trainer.epoch(1)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    callbacks[0].check_pending()  # waits for the copies, then decides: all finite
    assert trainer.steps == 2 * STEPS_PER_EPOCH and callbacks[0].checked == trainer.steps


# --- found by review: values changed in place, a failed fit, a checkpoint, copies ------


class _Reused:
    """A loop writing each step's loss into one reused buffer (as CUDA graphs do)."""

    @staticmethod
    def make(hw: Any, nan_at: int | None = None, fail_at: int | None = None) -> Any:
        class Loop(hw.Hookable):
            def __init__(self) -> None:
                self.model = torch.nn.Linear(2, 1)
                self.buffer = torch.zeros(())
                self.steps = 0

            @hw.hookable
            def fit(self, steps: int) -> None:
                for _ in range(steps):
                    self.step()

            @hw.hookable
            def step(self) -> None:
                self.steps += 1
                if self.steps == fail_at:
                    raise RuntimeError("the data loader died")
                self.loss(math.nan if self.steps == nan_at else 1.0 / self.steps)

            @hw.hookable
            def loss(self, value: float) -> Any:
                self.buffer.fill_(value)
                return self.buffer

        return Loop()


def test_a_loss_changed_in_place_after_its_step_is_checked_and_logged_as_it_was(hw, ht, tmp_path):
    loop = _Reused.make(hw, nan_at=3)
    loop.add_callback(ht.NanGuard())
    with pytest.raises(ht.NonFiniteError, match="returned nan at step 3"):
        loop.fit(10)
    loop = _Reused.make(hw)
    logger = ht.MetricsLogger(tmp_path / "m.csv", tensorboard=False)
    loop.add_callback(logger)
    loop.fit(4)
    assert [round(value, 4) for _, _, value in logger.read()] == [1.0, 0.5, 0.3333, 0.25]


def test_a_failed_fit_notes_what_it_queued_and_carries_nothing_into_the_next(hw, ht):
    guard = ht.NanGuard()
    failing = _Reused.make(hw, nan_at=3, fail_at=5)
    failing.add_callback(guard)
    with pytest.raises(RuntimeError, match="the data loader died") as info:
        failing.fit(10)
    assert any("NanGuard: before this error, event 'post-loss' returned nan at step 3" in note
               for note in info.value.__notes__)
    clean = _Reused.make(hw)
    clean.add_callback(guard)
    clean.fit(10)  # the NaN of the failed run is not raised here


def test_a_checkpoint_is_not_written_after_a_nan_the_guard_has_not_decided_yet(hw, ht, tmp_path):
    loop = _Reused.make(hw, nan_at=3)
    loop.add_callback(ht.NanGuard())  # deferred: would decide at check 20
    loop.add_callback(ht.Checkpoint(tmp_path / "ckpt", every_n_steps=5, optimizer=None))
    with pytest.raises(ht.NonFiniteError, match="returned nan at step 3"):
        loop.fit(30)
    assert not list((tmp_path / "ckpt").glob("*.pt"))  # stopped before the first write


def test_a_copy_of_a_callback_holds_what_was_queued(hw, ht):
    import copy
    import pickle

    loop = _Reused.make(hw, nan_at=2)
    guard = ht.NanGuard()
    loop.add_callback(guard)
    for _ in range(3):
        loop.step()
    restored = pickle.loads(pickle.dumps(guard))
    with pytest.raises(ht.NonFiniteError, match="returned nan at step 2"):
        restored.check_pending()
    copied = copy.deepcopy(guard)
    with pytest.raises(ht.NonFiniteError, match="returned nan at step 2"):
        copied.check_pending()
    # And the original, which holds it too: left undecided, it would be raised at the
    # next process-wide boundary (another test's `hookwrap run` script) once it is
    # garbage that the collector has not yet freed.
    with pytest.raises(ht.NonFiniteError, match="returned nan at step 2"):
        guard.check_pending()


def test_a_checkpoint_asks_only_the_guards_of_its_own_object(hw, ht, tmp_path):
    abandoned = _Reused.make(hw, nan_at=1)
    guard = ht.NanGuard()
    abandoned.add_callback(guard)
    abandoned.step()  # a NaN queued, never decided: that loop was left mid-run
    loop = _Reused.make(hw)
    loop.add_callback(ht.Checkpoint(tmp_path / "ckpt", every_n_steps=2, optimizer=None))
    loop.fit(4)  # not stopped by the other loop's guard
    assert (tmp_path / "ckpt" / "step=4.pt").is_file()
    with pytest.raises(ht.NonFiniteError, match="returned nan at step 1"):
        guard.check_pending()


# --- the float16 / spike / time-limit callbacks (issue 34) ----------------------------


def count_reads(hw: Any, *callbacks: Any) -> tuple[Any, Any]:
    from hookwrap.torch import count_host_reads

    trainer = tiny_loop(hw)
    for callback in callbacks:
        trainer.add_callback(callback)
    with count_host_reads() as reads:
        trainer.fit(EPOCHS)
    assert trainer.steps == 100 and trainer.stop_reason is None
    return trainer, reads


def test_spike_detection_reads_its_losses_back_together(hw, ht):
    """check_every=20 (the default), epochs of 20 steps: one .tolist() an epoch,
    every loss decided."""
    spikes = ht.SpikeDetection()
    _, reads = count_reads(hw, spikes)
    assert reads.count == EPOCHS and reads.by_method == {"tolist": EPOCHS}, reads
    assert spikes.seen == 100 and spikes.spikes == []


def test_time_limit_reads_nothing_back(hw, ht):
    limit = ht.TimeLimit(3600)
    _, reads = count_reads(hw, limit)
    assert reads.count == 0, reads
    assert limit.stopped_at is None and 0 < limit.time_elapsed() < 3600


def test_grad_scaler_reads_torchs_one_flag_a_step_and_grad_norm_beside_it_nothing_more(hw, ht):
    """scaler.step reads its found-inf flag back each step, as torch's does in the
    hand-written loop; GradNorm's unscaled norm is divided on the device: it adds no
    read to the scaler's (its norms are read when its history is)."""
    scaler = ht.GradScaler("cpu")
    _, reads = count_reads(hw, scaler)
    assert reads.count == 100 and reads.by_method == {"item": 100}, reads
    norm = ht.GradNorm(every=10)
    _, reads = count_reads(hw, ht.GradScaler("cpu"), norm)
    assert reads.count == 100 and reads.by_method == {"item": 100}, reads
    assert len(norm.history) == 10 and all(0 < n < 100 for _, n in norm.history)  # unscaled (the scale is 2**16)
