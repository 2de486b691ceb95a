"""hookwrap.torch.Checkpoint surviving what ends a run: a save on an exception
(``on_exception``) and on a termination signal (``on_signal``), each resumed with
``resume`` to the weights of a run that never stopped (both implementations).

The loop is tests/torch/_survive_worker.py: steps that draw their own batch from
torch's RNG, dropout, a ``random`` jitter, a per-step scheduler and EarlyStopping,
so that a resume reaches the same weights only when everything of the last
completed step comes back."""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="hookwrap.torch needs torch (the torch extra)")

from tests.torch import _survive_worker as worker


def _same_weights(a: Any, b: Any) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))


# --- on_exception ---------------------------------------------------------------------


@pytest.mark.parametrize("fail_at", [1, 7, 13])  # the first step, mid-way, after an evaluation
def test_a_step_that_raises_leaves_the_last_completed_step_and_resumes_to_the_same_weights(
        hw, ht, tmp_path, fail_at, caplog):
    straight = worker.build(hw, ht, str(tmp_path / "straight"))
    straight.fit(worker.STEPS)

    failing = worker.build(hw, ht, str(tmp_path / "failed"), fail_at=fail_at, on_exception=True)
    with caplog.at_level(logging.INFO, logger="hookwrap"), pytest.raises(worker.Failed) as raised:
        failing.fit(worker.STEPS)
    assert str(raised.value) == f"step {fail_at} failed"  # the exception itself, unchanged
    assert any("saved the run after step" in note for note in raised.value.__notes__)
    assert f"Failed raised; saved the run after step {fail_at - 1} (the last completed)" in caplog.text
    assert sorted(os.listdir(tmp_path / "failed")) == ["exception.pt", "last.pt"]
    saved = torch.load(tmp_path / "failed" / "exception.pt", weights_only=True)
    assert saved["step"] == fail_at - 1 == failing.steps
    # The weights of the last completed step: the failed step changed nothing.
    assert all(torch.equal(saved["model"][name], value) for name, value in failing.model.state_dict().items())

    resumed = worker.build(hw, ht, str(tmp_path / "failed"), on_exception=True)
    assert worker.resume(resumed, "exception") == fail_at - 1
    resumed.fit(worker.STEPS, fail_at - 1)
    assert resumed.steps == worker.STEPS and _same_weights(resumed, straight)
    early_stopping = hw.callback_state(resumed)["EarlyStopping[monitor=val_loss,mode=min]"]
    assert early_stopping == hw.callback_state(straight)["EarlyStopping[monitor=val_loss,mode=min]"]


def test_without_the_rng_of_the_last_completed_step_the_resume_differs(hw, ht, tmp_path):
    """The test above would fail if the save held the RNG states at the exception
    (after the failed step's draws) rather than those after the last completed step."""
    straight = worker.build(hw, ht, str(tmp_path / "straight"))
    straight.fit(worker.STEPS)
    failing = worker.build(hw, ht, str(tmp_path / "failed"), fail_at=7, on_exception=True)
    with pytest.raises(worker.Failed):
        failing.fit(worker.STEPS)
    resumed = worker.build(hw, ht, str(tmp_path / "failed"), on_exception=True)
    worker.resume(resumed, "exception")
    torch.randint(0, 2, (worker.BATCH,))  # the failed step's batch drawn again
    resumed.fit(worker.STEPS, 6)
    assert not _same_weights(resumed, straight)


def test_an_exception_outside_a_step_saves_every_completed_step(hw, ht, tmp_path):
    loop = worker.build(hw, ht, str(tmp_path), on_exception=True, save_last=False)

    def broken(self: Any) -> None:
        raise ValueError("the evaluation broke")

    loop.before("evaluate", broken)
    with pytest.raises(ValueError, match="the evaluation broke"):
        loop.fit(worker.STEPS)
    assert os.listdir(tmp_path) == ["exception.pt"]  # save_last=False: no last.pt
    assert torch.load(tmp_path / "exception.pt", weights_only=True)["step"] == worker.EVAL_EVERY


def test_stop_training_and_a_clean_end_save_no_exception_file(hw, ht, tmp_path):
    loop = worker.build(hw, ht, str(tmp_path), on_exception=True)
    loop.fit(worker.STEPS)
    assert sorted(os.listdir(tmp_path)) == ["last.pt"]


def test_a_save_that_fails_adds_a_note_and_the_exception_still_propagates(hw, ht, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    loop = worker.build(hw, ht, str(blocker / "sub"), fail_at=3, on_exception=True)
    with caplog.at_level(logging.INFO, logger="hookwrap"), pytest.raises(worker.Failed) as raised:
        loop.fit(worker.STEPS)
    assert any("could not be saved" in note for note in raised.value.__notes__)
    assert "saving it failed" in caplog.text


def test_on_exception_on_a_target_with_steps_only(hw, ht, tmp_path):
    """No fit join point: the step's own error event saves."""
    import random

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    class Steps(hw.Hookable):
        def __init__(self) -> None:
            self.model, self.optimizer = model, optimizer

        @hw.hookable
        def step(self, fail: bool) -> None:
            random.random()
            if fail:
                raise KeyError("bad batch")
            self.optimizer.zero_grad()
            torch.autograd.backward(self.model(torch.ones(1, 2)).sum())
            self.optimizer.step()

    loop = Steps()
    loop.add_callback(ht.Checkpoint(tmp_path, on_exception=True))
    loop.step(False)
    loop.step(False)
    with pytest.raises(KeyError):
        loop.step(True)
    saved = torch.load(tmp_path / "exception.pt", weights_only=True)
    assert saved["step"] == 2 and torch.equal(saved["model"]["weight"], model.weight.detach())


def test_on_exception_settings_are_checked(hw, ht, tmp_path):
    with pytest.raises(hw.HookError, match=r"on_exception must be True or False, got 'yes'"):
        ht.Checkpoint(tmp_path, on_exception="yes")

    class Nothing(hw.Hookable):
        @hw.hookable
        def epoch(self) -> None:
            pass

    with pytest.raises(hw.HookError, match=r"on_exception saves when the run raises.*neither 'fit' nor 'step'"):
        Nothing().add_callback(ht.Checkpoint(tmp_path, on_exception=True))


# --- on_signal ------------------------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD_TIMEOUT_S = 300  # a loaded 2-core machine: generous; nothing waits on time as a signal


def _child(hw: Any, *args: str) -> Any:
    """``python -m tests.torch._survive_worker ARGS`` with the implementation under test."""
    import subprocess
    import sys

    source = os.path.dirname(os.path.dirname(os.path.abspath(hw.__file__)))
    env = dict(os.environ, HOOKWRAP_NO_EXTENSIONS="" if hw.USING_EXTENSION else "1",
               PYTHONPATH=os.pathsep.join([source, ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "tests.torch._survive_worker", *args], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(child: Any) -> tuple[str, str]:
    import subprocess

    try:
        return child.communicate(timeout=CHILD_TIMEOUT_S)  # type: ignore[no-any-return]
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        pytest.fail(f"the child did not end within {CHILD_TIMEOUT_S} s:\n{out}\n{err}")


def test_sigterm_saves_after_the_step_exits_143_and_a_new_process_resumes_to_the_same_weights(hw, ht, tmp_path):
    import signal
    import threading

    straight = worker.build(hw, ht, str(tmp_path / "straight"))
    straight.fit(worker.STEPS)
    folder = str(tmp_path / "run")

    first = _child(hw, folder, "10", str(tmp_path / "first.pt"))
    watchdog = threading.Timer(CHILD_TIMEOUT_S, first.kill)  # a hung child fails the test, never hangs it
    watchdog.start()
    try:
        lines = []
        for line in first.stdout:  # the handshake: the child waits on stdin after step 10
            lines.append(line)
            if line.startswith("reached"):
                break
        assert lines[-1:] == ["reached 10\n"], "".join(lines) + first.stderr.read()
        first.send_signal(signal.SIGTERM)  # lands while the child waits inside step 10
        first.stdin.write("go\n")
        first.stdin.flush()
        out, err = _finish(first)
    finally:
        watchdog.cancel()
    assert first.returncode == 128 + signal.SIGTERM, err  # as a shell reports a process SIGTERM ended
    assert "done" not in out and not os.path.exists(tmp_path / "first.pt")
    assert sorted(os.listdir(folder)) == ["last.pt", "signal.pt"]
    saved = torch.load(os.path.join(folder, "signal.pt"), weights_only=True)
    assert saved["step"] == 10  # the step the signal came in, completed

    second = _child(hw, folder, "0", str(tmp_path / "second.pt"), "resume")
    out, err = _finish(second)
    assert second.returncode == 0, err
    assert out.splitlines() == ["start 10", f"done {worker.STEPS}"]
    final = torch.load(tmp_path / "second.pt", weights_only=True)
    assert all(torch.equal(final[name], value) for name, value in straight.model.state_dict().items())


def test_a_previous_python_handler_is_chained_after_the_save_and_put_back(hw, ht, tmp_path):
    import signal

    seen: list[tuple[int, bool]] = []

    def previous(signum: int, frame: Any) -> None:  # returns: the run goes on, as it would have
        seen.append((signum, os.path.exists(tmp_path / "signal.pt")))

    def after_step(n: int) -> None:
        if n == 3:
            signal.raise_signal(signal.SIGUSR1)

    old = signal.signal(signal.SIGUSR1, previous)
    try:
        loop = worker.build(hw, ht, str(tmp_path), after_step=after_step, on_signal="SIGUSR1")
        loop.fit(worker.STEPS)
        assert signal.getsignal(signal.SIGUSR1) is previous
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert seen == [(signal.SIGUSR1, True)]  # called once, after signal.pt was written
    assert loop.steps == worker.STEPS
    assert torch.load(tmp_path / "signal.pt", weights_only=True)["step"] == 3


def test_the_default_action_ends_the_run_with_systemexit_and_the_handlers_come_back(hw, ht, tmp_path):
    import signal

    def after_step(n: int) -> None:
        if n == 5:
            signal.raise_signal(signal.SIGTERM)  # our handler is installed: only a flag
        assert n <= 5, "the run went on after the signal"

    before = signal.getsignal(signal.SIGTERM)
    loop = worker.build(hw, ht, str(tmp_path), after_step=after_step, on_signal=(signal.SIGTERM,),
                        on_exception=True)
    with pytest.raises(SystemExit) as ended:
        loop.fit(worker.STEPS)
    assert ended.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before
    assert sorted(os.listdir(tmp_path)) == ["last.pt", "signal.pt"]  # no exception.pt for the exit


def test_a_signal_save_that_fails_is_logged_and_the_signal_still_ends_the_run(hw, ht, tmp_path, caplog):
    import signal

    def after_step(n: int) -> None:
        if n == 2:
            signal.raise_signal(signal.SIGTERM)

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    loop = worker.build(hw, ht, str(blocker / "sub"), after_step=after_step, on_signal=signal.SIGTERM)
    with caplog.at_level(logging.INFO, logger="hookwrap"), pytest.raises(SystemExit) as ended:
        loop.fit(worker.STEPS)
    assert ended.value.code == 128 + signal.SIGTERM and loop.steps == 2
    assert "SIGTERM received; saving the run after step 2 failed" in caplog.text
    assert isinstance(ended.value.__context__, OSError)


def test_on_signal_installs_in_the_main_thread_only_and_checks_its_settings(hw, ht, tmp_path):
    import signal
    import threading

    for bad, said in [("SIGNOPE", "'SIGNOPE' is not a signal"), ((), "names no signal"),
                      (signal.SIGKILL, "SIGKILL cannot be caught"), (3.5, "must be a signal")]:
        with pytest.raises(hw.HookError, match=said):
            ht.Checkpoint(tmp_path, on_signal=bad)
    loop = worker.build(hw, ht, str(tmp_path), on_signal=signal.SIGTERM)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            loop.fit(2)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            failed.append(exc)

    thread = threading.Thread(target=run, name="trainer")
    thread.start()
    thread.join()
    assert len(failed) == 1 and isinstance(failed[0], hw.HookError)
    assert "main thread only, and fit runs in thread 'trainer'" in str(failed[0])

    class Steps(hw.Hookable):
        @hw.hookable
        def step(self) -> None:
            pass

    with pytest.raises(hw.HookError, match="on_signal installs its handlers when fit starts"):
        Steps().add_callback(ht.Checkpoint(tmp_path, on_signal=signal.SIGTERM))


@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason="needs torch.distributed with gloo")
def test_a_signal_one_rank_gets_is_saved_by_every_rank_after_the_same_step(hw, tmp_path):
    import signal

    from tests._ranks import run_ranks

    flag = "" if hw.USING_EXTENSION else "1"
    results = run_ranks(worker.signalled, (2, str(tmp_path / "init"), str(tmp_path), flag, 120.0), 2, 300, tmp_path)
    # Rank 1 alone got it; both agreed after step 5, saved together (rank 0 wrote),
    # and both handed it on (the previous handlers returned: the run went on).
    assert [r["handed_on"] for r in results] == [[signal.SIGUSR1], [signal.SIGUSR1]]
    assert [r["saved_step"] for r in results] == [5, 5] and [r["steps"] for r in results] == [24, 24]
    assert results[0]["weights"] == results[1]["weights"]
    assert sorted(os.listdir(tmp_path / "run")) == ["last.pt", "signal.pt"]


# --- fsspec paths -----------------------------------------------------------------------


@pytest.fixture
def memory_url(request: pytest.FixtureRequest) -> Any:
    """A fresh folder of fsspec's in-memory filesystem (process-wide: removed after),
    its subfolder ``run``; the test's others beside it."""
    import re

    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    folder = "/" + re.sub(r"\W", "_", request.node.name)
    yield f"memory://{folder.lstrip('/')}/run"
    if fs.exists(folder):
        fs.rm(folder, recursive=True)


def _memory_load(url: str) -> Any:
    import io

    import fsspec

    with fsspec.open(url, "rb") as f:
        return torch.load(io.BytesIO(f.read()), weights_only=True)


def _memory_names(url: str) -> list[str]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    return sorted(entry.rpartition("/")[2] for entry in fs.ls(path, detail=False))


def test_a_memory_url_saves_keeps_the_top_k_and_resumes(hw, ht, memory_url):
    straight = worker.build(hw, ht, memory_url.replace("/run", "/straight"))
    straight.fit(worker.STEPS)
    first = worker.build(hw, ht, memory_url, monitor="val_loss", mode="max", save_top_k=2, every_n_steps=8,
                         fail_at=14, on_exception=True)
    with pytest.raises(worker.Failed):
        first.fit(worker.STEPS)
    # mode="max" on a falling loss: the first evaluations are the best, later ones are
    # not kept; with save_top_k=2 the third evaluation evicted none of them.
    assert _memory_names(memory_url) == ["best-epoch=0-step=4.pt", "best-epoch=0-step=8.pt", "exception.pt",
                                         "last.pt", "step=8.pt"]
    assert str(first.checkpoint.best_path) == f"{memory_url}/best-epoch=0-step=4.pt"
    assert str(first.checkpoint.dir) == memory_url and first.checkpoint.where == f"Checkpoint({memory_url!r})"
    assert sorted(path.name for path in first.checkpoint.dir.iterdir()) == _memory_names(memory_url)
    assert first.checkpoint.dir.is_dir() and (first.checkpoint.dir / "last.pt").is_file()

    resumed = worker.build(hw, ht, memory_url, monitor="val_loss", mode="max", save_top_k=2, every_n_steps=8,
                           on_exception=True)
    assert worker.resume(resumed, "exception") == 13
    assert resumed.checkpoint.resolve("best") == resumed.checkpoint.dir / "best-epoch=0-step=4.pt"
    resumed.fit(worker.STEPS, 13)
    assert _same_weights(resumed, straight)
    assert _memory_load(f"{memory_url}/best-epoch=0-step=4.pt")["step"] == 4


def test_top_k_eviction_removes_files_on_a_memory_url(hw, ht, memory_url):
    loop = worker.build(hw, ht, memory_url, monitor="val_loss", save_top_k=1, save_last=False)
    loop.fit(worker.STEPS)  # a falling loss: each evaluation is the best, the one before evicted
    assert _memory_names(memory_url) == [f"best-epoch=0-step={worker.STEPS}.pt"]
    again = worker.build(hw, ht, memory_url, monitor="val_loss", save_top_k=1, save_last=False)
    assert again.checkpoint.resume(again, f"{memory_url}/best-epoch=0-step={worker.STEPS}.pt")["step"] == 24
    assert _same_weights(again, loop)


def test_a_file_url_is_written_atomically_as_a_local_path(hw, ht, tmp_path, renames):
    loop = worker.build(hw, ht, f"file://{tmp_path}", every_n_steps=12)
    loop.fit(worker.STEPS)
    assert sorted(os.listdir(tmp_path)) == ["last.pt", "step=12.pt", "step=24.pt"]
    assert {destination for _, destination in renames} == {"last.pt", "step=12.pt", "step=24.pt"}
    assert all(source.startswith(".") and source.endswith(".tmp") for source, _ in renames)
    again = worker.build(hw, ht, f"file://{tmp_path}")
    assert worker.resume(again, "last") == worker.STEPS and _same_weights(again, loop)
    best = ht.BestCheckpoint(f"file://{tmp_path}/best.pt")
    assert str(best.path) == str(tmp_path / "best.pt")


def test_best_checkpoint_takes_a_memory_url_and_restores_from_it(hw, ht, memory_url):
    loop = worker.build(hw, ht, memory_url.replace("/run", "/checkpoints"))
    best = ht.BestCheckpoint(f"{memory_url}/best.pt", restore_best=True)
    loop.add_callback(best)
    loop.fit(worker.STEPS)
    assert _memory_names(memory_url) == ["best.pt"] and best.saved >= 1


def test_a_url_without_fsspec_or_with_an_unknown_protocol_is_refused_when_made(hw, ht, tmp_path, monkeypatch):
    import sys

    with pytest.raises(hw.HookError, match=r"fsspec cannot open 'nope://x'.*Install the package of that protocol"):
        ht.Checkpoint("nope://x")
    monkeypatch.setitem(sys.modules, "fsspec", None)  # as if it were not installed
    with pytest.raises(hw.HookError, match=r"Checkpoint\('memory://x'\): 'memory://x' is a URL, and URLs are "
                                           r"opened with fsspec, which is not installed"):
        ht.Checkpoint("memory://x")
    with pytest.raises(hw.HookError, match=r"BestCheckpoint\('memory://x/b.pt'\).*not installed"):
        ht.BestCheckpoint("memory://x/b.pt")
    ht.Checkpoint(tmp_path)  # a local path needs no fsspec


# --- sharded: FSDP and torch.distributed.checkpoint -------------------------------------


def _fully_shard_runs_here() -> bool:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return False
    try:
        import torch.distributed.fsdp as fsdp
    except ImportError:
        return False
    return hasattr(fsdp, "fully_shard")  # FSDP2


@pytest.mark.skipif(not _fully_shard_runs_here(), reason="needs torch.distributed with gloo and FSDP2")
def test_an_fsdp_model_is_saved_in_shards_by_every_rank_and_resumes_exactly(hw, tmp_path):
    from tests._ranks import run_ranks

    flag = "" if hw.USING_EXTENSION else "1"
    results = run_ranks(worker.sharded, (2, str(tmp_path / "init"), str(tmp_path), flag, 120.0), 2, 300, tmp_path)
    for rank in results:
        assert rank["sharded"] and (rank["at"], rank["start"]) == (12, 12)
        assert rank["round_trip_model"] and rank["round_trip_optimizer"] and rank["not_the_later_state"]
        assert rank["resumed_equals_straight"]
    assert results[0]["files"] == ["last.pt", "step=12.pt", "step=18.pt", "step=24.pt", "step=6.pt"]
    # One folder a checkpoint: each rank's shard, DCP's metadata, the rest of the state.
    assert results[0]["shards"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "state.pt"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: FSDP over NCCL, one GPU a rank")
def test_an_fsdp_model_on_gpus_is_saved_in_shards_and_resumes_exactly(hw, tmp_path):
    if not (_fully_shard_runs_here() and torch.distributed.is_nccl_available()):
        pytest.skip("needs torch.distributed with NCCL and FSDP2")
    from tests._ranks import run_ranks

    world = min(2, torch.cuda.device_count())
    flag = "" if hw.USING_EXTENSION else "1"
    results = run_ranks(worker.sharded, (world, str(tmp_path / "init"), str(tmp_path), flag, 120.0, "cuda"),
                        world, 300, tmp_path)
    for rank in results:
        assert rank["sharded"] and (rank["at"], rank["start"]) == (12, 12)
        assert rank["round_trip_model"] and rank["round_trip_optimizer"] and rank["not_the_later_state"]
        assert rank["resumed_equals_straight"]
    assert results[0]["shards"] == sorted([".metadata", "state.pt"] + [f"__{r}_0.distcp" for r in range(world)])


def test_sharded_true_saves_a_plain_model_through_dcp_in_one_process(hw, ht, tmp_path):
    pytest.importorskip("torch.distributed.checkpoint")
    straight = worker.build(hw, ht, str(tmp_path / "straight"))
    straight.fit(worker.STEPS)
    first = worker.build(hw, ht, str(tmp_path / "run"), sharded=True, monitor="val_loss", save_top_k=1,
                         fail_at=15)
    with pytest.raises(worker.Failed):
        first.fit(worker.STEPS)
    names = sorted(os.listdir(tmp_path / "run"))
    assert names == ["best-epoch=0-step=12.pt"]  # save_last=True: last.pt comes at the end of fit only
    assert sorted(os.listdir(tmp_path / "run" / names[0])) == [".metadata", "__0_0.distcp", "state.pt"]
    resumed = worker.build(hw, ht, str(tmp_path / "run"), sharded=True, monitor="val_loss", save_top_k=1)
    assert worker.resume(resumed, str(tmp_path / "run" / names[0])) == 12
    resumed.fit(worker.STEPS, 12)
    assert _same_weights(resumed, straight)
    # The top-k evicted the earlier best folders; the last one is a folder too.
    assert sorted(os.listdir(tmp_path / "run")) == [f"best-epoch=0-step={worker.STEPS}.pt", "last.pt"]
    with pytest.raises(hw.HookError, match=r"sharded must be True, False or None"):
        ht.Checkpoint(tmp_path, sharded="yes")
