"""Checkpoints a user can trust with the run and with the machine (issue 41): nothing
hookwrap loads runs code, every name read from a file stays in its folder, a file
holds the state of the moment that decided it, a failed write leaves top-k and the
folder as they were, stray temporary files go, and paths read as fsspec reads them
(both implementations)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra")

from tests.torch._crafted import OpensAFile  # noqa: E402


def make_loop(hw: Any, scores: list[float], changes: dict[int, float] | None = None, fit: bool = True) -> Any:
    """Each evaluation sets the weight to its index (0.0, 1.0, ...) and returns the next
    score; ``changes``: between evaluations, code that is no join point sets the weight."""

    class Loop(hw.Hookable):
        def __init__(self) -> None:
            self.model = torch.nn.Linear(1, 1, bias=False)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            self.scores = list(scores)

        @hw.hookable
        def step(self) -> None:
            pass

        @hw.hookable
        def evaluate(self, index: int) -> dict[str, float]:
            with torch.no_grad():
                self.model.weight.fill_(float(index))
            return {"val_loss": self.scores[index]}

        def run(self) -> None:
            for index in range(len(self.scores)):
                self.evaluate(index)
                if changes and index in changes:  # no join point: nothing hookwrap sees
                    with torch.no_grad():
                        self.model.weight.fill_(changes[index])

    class FitLoop(Loop):
        @hw.hookable
        def fit(self) -> None:
            self.run()

    return FitLoop() if fit else Loop()


def _checkpointed(hw: Any, ht: Any, folder: Path, scores: list[float], **options: Any) -> Any:
    loop = make_loop(hw, scores)
    loop.checkpoint = ht.Checkpoint(folder, monitor="val_loss", **options)
    loop.add_callback(loop.checkpoint)
    return loop


# --- nothing hookwrap loads runs code ---------------------------------------------------


def test_a_crafted_last_pt_runs_no_code_on_resume(hw, ht, tmp_path):
    marker = tmp_path / "marker"
    folder = tmp_path / "ck"
    folder.mkdir()
    torch.save({"model": {}, "callbacks": {"x": OpensAFile(marker)}}, folder / "last.pt")
    loop = _checkpointed(hw, ht, folder, [1.0])
    with pytest.raises(hw.HookError, match=r"last\.pt.*holds more than tensors and plain data.*io\.open"):
        loop.checkpoint.resume(loop, "last")
    with pytest.raises(hw.HookError, match=r"last\.pt.*weights_only=True"):
        ht.Checkpoint(folder, monitor="val_loss").resolve("best")  # reads top-k from last.pt
    fresh = _checkpointed(hw, ht, folder, [1.0], resume_from="last")
    with pytest.raises(hw.HookError, match=r"last\.pt"):
        fresh.fit()
    assert not marker.exists()


def test_resume_offers_no_weights_only_false(hw, ht, tmp_path):
    loop = _checkpointed(hw, ht, tmp_path, [1.0])
    loop.fit()
    with pytest.raises(TypeError, match="weights_only"):
        loop.checkpoint.resume(loop, "last", weights_only=False)


def test_load_callback_state_takes_plain_data_only(hw, ht, tmp_path):
    loop = _checkpointed(hw, ht, tmp_path, [1.0])
    loop.fit()
    state = hw.callback_state(loop)
    # What a callback_state holds loads under weights_only=True ...
    torch.save(state, tmp_path / "state.pt")
    hw.load_callback_state(loop, torch.load(tmp_path / "state.pt", weights_only=True))
    # ... and anything else (what a weights_only=False load could make) is refused.
    key = loop.checkpoint.state_key
    bad = {key: {**state[key], "top_k": [object()]}}
    with pytest.raises(hw.HookError, match=r"holds builtins\.object at \[.*\]\['top_k'\]\[0\].*plain data"):
        hw.load_callback_state(loop, bad)
    with pytest.raises(hw.HookError, match="plain data"):
        hw.CallbackState(loop).load_state_dict(bad)


# --- every name read from a file stays in its folder ------------------------------------


@pytest.mark.parametrize("name", ["../outside.pt", "ABSOLUTE"])
def test_a_crafted_top_k_name_is_refused(hw, ht, tmp_path, name):
    folder = tmp_path / "ck"
    loop = _checkpointed(hw, ht, folder, [1.0])
    loop.fit()
    outside = tmp_path / "outside.pt"
    name = str(outside) if name == "ABSOLUTE" else name
    torch.save(torch.load(folder / "last.pt", weights_only=True), outside)  # a loadable file there
    saved = torch.load(folder / "last.pt", weights_only=True)
    saved["callbacks"][loop.checkpoint.state_key]["top_k"] = [[0.1, 0, name]]
    torch.save(saved, folder / "last.pt")

    fresh = _checkpointed(hw, ht, folder, [1.0])  # a fresh process: top-k read from last.pt
    with pytest.raises(hw.HookError, match=rf"last\.pt.*{name!r}.*a \.pt file of the folder"):
        fresh.checkpoint.resolve("best")
    with pytest.raises(hw.HookError, match=rf"last\.pt.*{name!r}"):
        fresh.checkpoint.resume(fresh, "best")
    assert fresh.checkpoint.step == 0 and fresh.checkpoint.top_k == []


# --- a file holds the state of the moment that decided it -------------------------------


@pytest.mark.parametrize("fit", [True, False], ids=["with-fit", "without-fit"])
def test_two_evaluations_without_a_step_each_best_file_holds_its_weights(hw, ht, tmp_path, fit):
    # Two validation sets: evaluation 0 (val 0.5, weight 0.0) is the best; between the two,
    # code that is no join point changes the weights (weight 7.0), then evaluation 1 sets 1.0.
    loop = make_loop(hw, [0.5, 0.9], changes={0: 7.0}, fit=fit)
    loop.checkpoint = ht.Checkpoint(tmp_path / "ck", monitor="val_loss", save_last=False)
    loop.best = ht.BestCheckpoint(tmp_path / "best.pt", monitor="val_loss")
    loop.stopping = ht.EarlyStopping("val_loss", patience=5)
    loop.add_callback(loop.checkpoint)  # attached first: its file still holds EarlyStopping's decision
    loop.add_callback(loop.best)
    loop.add_callback(loop.stopping)
    loop.fit() if fit else loop.run()
    (name,) = os.listdir(tmp_path / "ck")
    saved = torch.load(tmp_path / "ck" / name, weights_only=True)
    assert torch.equal(saved["model"]["weight"], torch.zeros(1, 1))
    assert torch.equal(torch.load(tmp_path / "best.pt", weights_only=True)["model"]["weight"], torch.zeros(1, 1))
    # Every callback's state after that evaluation, whatever order they were attached in.
    (stopping,) = [state for key, state in saved["callbacks"].items() if key.startswith("EarlyStopping")]
    assert stopping["best"] == 0.5 and stopping["wait"] == 0


def test_every_n_steps_file_holds_the_weights_of_its_step(hw, ht, tmp_path):
    class Loop(hw.Hookable):
        def __init__(self) -> None:
            self.model = torch.nn.Linear(1, 1, bias=False)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

        @hw.hookable
        def fit(self) -> None:
            for index in range(4):
                self.step(index)
                with torch.no_grad():  # between steps: no join point
                    self.model.weight.fill_(-1.0)

        @hw.hookable
        def step(self, index: int) -> None:
            with torch.no_grad():
                self.model.weight.fill_(float(index + 1))

    loop = Loop()
    loop.add_callback(ht.Checkpoint(tmp_path, every_n_steps=2, save_last=False))
    loop.fit()
    for step in (2, 4):
        saved = torch.load(tmp_path / f"step={step}.pt", weights_only=True)
        assert torch.equal(saved["model"]["weight"], torch.full((1, 1), float(step))) and saved["step"] == step


def test_runs_last_orders_after_every_tier(hw, ht, tmp_path):
    loop = make_loop(hw, [0.5])
    checkpoint = ht.Checkpoint(tmp_path, monitor="val_loss")
    loop.add_callback(checkpoint)
    order: list[str] = []
    loop.after("evaluate", lambda self: order.append("instance"))
    with hw.register_global_callback(("post-evaluate", lambda self: order.append("global"))):
        text = str(hw.describe(loop, "post-evaluate"))
        loop.fit()
    assert order == ["instance", "global"] and os.listdir(tmp_path)
    # The write after the global tier's callback too: hookwrap.describe shows it last.
    assert "Checkpoint._boundary" in text.rstrip().splitlines()[-1]


# --- a failed write leaves top-k and the folder as they were ----------------------------


def test_a_disk_full_write_keeps_top_k_and_the_folder(hw, ht, tmp_path, monkeypatch):
    io_class = type(ht.Checkpoint(tmp_path / "unused").io)
    real = io_class.write_atomically
    failing = {"on": None}

    def write_atomically(self: Any, path: Path, data: bytes) -> None:
        if failing["on"] is not None and path.name.startswith(failing["on"]):
            raise OSError(28, "No space left on device")
        real(self, path, data)

    monkeypatch.setattr(io_class, "write_atomically", write_atomically)
    loop = _checkpointed(hw, ht, tmp_path / "ck", [0.5, 0.4, 0.3, 0.2])
    loop.checkpoint.save_top_k = 1
    loop.evaluate(0)
    before = sorted(os.listdir(tmp_path / "ck"))
    kept = list(loop.checkpoint.top_k)
    assert before == ["best-epoch=0-step=0.pt"]  # no fit, no epoch: last.pt comes at the end of fit
    failing["on"] = "best-"  # the second best file: the disk is full
    with pytest.raises(OSError, match="No space left"):
        loop.evaluate(1)
    assert loop.checkpoint.top_k == kept and loop.checkpoint.resolve("best") == tmp_path / "ck" / kept[0][2]
    assert sorted(os.listdir(tmp_path / "ck")) == before
    failing["on"] = None
    loop.evaluate(2)  # room again: one best file, with save_top_k=1
    assert [n for n in os.listdir(tmp_path / "ck") if n.startswith("best-")] == ["best-epoch=0-step=0-v1.pt"]
    assert loop.checkpoint.top_k == [(0.3, 0, "best-epoch=0-step=0-v1.pt")]


# --- stray temporary files ------------------------------------------------------------


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_stray_temporary_file_is_removed_by_the_next_save(hw, ht, tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    dead = _dead_pid()
    stray = [folder / f".last.pt.{dead}.tmp", folder / f".best-epoch=0-step=3.pt.{dead}.tmp"]
    kept = [folder / f".last.pt.{os.getppid()}.tmp",  # a live process's: being written
            folder / f".notes.txt.{dead}.tmp", folder / "other.tmp", folder / f"last.pt.{dead}.tmp"]
    for path in stray + kept:
        path.write_bytes(b"torn")
    loop = _checkpointed(hw, ht, folder, [0.5])
    loop.fit()
    assert not any(path.exists() for path in stray)
    assert all(path.exists() for path in kept)
    assert {"last.pt", "best-epoch=0-step=0.pt"} <= set(os.listdir(folder))


# --- paths read as the user and fsspec read them --------------------------------------


def test_file_urls_land_where_fsspec_says(hw, ht, tmp_path, monkeypatch):
    fsspec = pytest.importorskip("fsspec")
    monkeypatch.chdir(tmp_path)
    for url in (f"file:{tmp_path}/ck", f"file://{tmp_path}/ck3", "file:relative/ck2"):
        expected = Path(fsspec.core.url_to_fs(url)[1])
        loop = _checkpointed(hw, ht, url, [0.5])
        loop.fit()
        assert (expected / "last.pt").is_file(), url
    best = ht.BestCheckpoint(f"file:{tmp_path}/b/best.pt", monitor="val_loss")
    assert best.path == tmp_path / "b" / "best.pt"
    logger = ht.MetricsLogger(f"file:{tmp_path}/m/metrics.csv", tensorboard=False)
    assert logger.path == tmp_path / "m" / "metrics.csv"
    assert not (tmp_path / "file:").exists()
    with pytest.raises(hw.HookError, match=r"memory://.*open\(\) on the local filesystem"):
        ht.MetricsLogger("memory://m.csv", tensorboard=False)
