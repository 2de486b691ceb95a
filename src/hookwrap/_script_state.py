"""``hookwrap run --state FILE``: the callbacks' state rides on the script's own
checkpoints, so a script's own resume (nanoGPT's ``--init_from=resume``) resumes the
callbacks too: best values, patience, step counters.

Each time the script saves to a file with ``torch.save``, the state of every stateful
callback of the run is written to ``FILE`` for that file (with its size and
modification time). When the script loads that very checkpoint with ``torch.load``
(before the callbacks exist, or after), they get the state saved with it back.

A script that saves right after an evaluation and resumes at the top of that same
iteration (nanoGPT: ``iter_num`` saved, the loop resumed at it) evaluates again: that
evaluation replaces the one the checkpoint saw, so EarlyStopping's patience is not
spent twice. Where the run has a ``step`` join point (else a ``loss`` one, its calls
with gradients enabled marking training), the state from before that evaluation is
saved too, and the first evaluation after the resume that comes before any training
decides from it. With neither, a redone evaluation cannot be told from the next, and
the resume says so. A checkpoint changed since (a save that ended before
``FILE`` was written) is said, and the callbacks start afresh. ``FILE`` is plain data, read with
``torch.load(weights_only=True)``, and written whole or not at all."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any, Callable

from ._callback import Callback, keyed_by_state_key, load_keyed_state
from .errors import HookError

__all__ = ["ScriptState"]

PROG = "hookwrap run"


def _path_of(f: Any) -> str | None:
    """The file ``torch.save``/``torch.load`` is given: a path, or an open file's name
    (``with open(path, "wb") as f: torch.save(model, f)``, as word_language_model
    saves); None for a buffer."""
    if isinstance(f, (str, os.PathLike)):
        return os.path.abspath(os.fspath(f))
    name = getattr(f, "name", None)
    return os.path.abspath(name) if isinstance(name, str) and os.path.isfile(name) else None


def _stamp(path: str) -> dict[str, Any]:
    info = os.stat(path)
    return {"path": path, "size": info.st_size, "mtime_ns": info.st_mtime_ns}


class ScriptState:
    """One run's ``--state FILE``: ``install()`` before the script runs (it wraps
    ``torch.save`` and ``torch.load``), ``attach(callbacks)`` once they are registered,
    ``remove()`` at the end."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.callbacks: list[Any] | None = None
        self._pending: dict[str, Any] | None = None  # loaded before the callbacks existed
        self._originals: tuple[Callable[..., Any], Callable[..., Any]] | None = None
        self.restored_from: str | None = None
        self._checkpoints: dict[str, Any] | None = None
        self._before_evaluation: dict[str, Any] | None = None  # the state before this step's evaluation
        self._redo: dict[str, Any] | None = None  # restored: the state an evaluation redone decides from
        self._tracker: Any = None
        self._tracker_handle: Any = None  # its registration, removed by remove()
        self._saved_here: set[str] = set()  # the checkpoints this run saved: loading one is no resume

    # --- the torch functions the script calls --------------------------------------

    def install(self) -> None:
        import torch

        save, load = torch.save, torch.load
        self._originals = (save, load)

        def save_then_state(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            result = save(obj, f, *args, **kwargs)
            path = _path_of(f)
            if path is not None and path != self.path and self.callbacks is not None and self._originals:
                flush = getattr(f, "flush", None)
                if flush is not None:  # an open file: its size and time as they will stay
                    flush()
                self._saved_here.add(path)
                self._write(path)
            return result

        def load_then_state(f: Any, *args: Any, **kwargs: Any) -> Any:
            result = load(f, *args, **kwargs)
            path = _path_of(f)
            # A checkpoint this run saved (word_language_model reloading its best model at
            # its end) is no resume: the callbacks go on as they are.
            if path is not None and path != self.path and path not in self._saved_here and self._originals and (
                    self._checkpoints is not None or os.path.isfile(self.path)):
                self._loaded(path)
            return result

        save_then_state.__wrapped__ = save  # type: ignore[attr-defined]
        load_then_state.__wrapped__ = load  # type: ignore[attr-defined]
        torch.save, torch.load = save_then_state, load_then_state

    def remove(self) -> None:
        if self._tracker_handle is not None:
            self._tracker_handle.remove()
            self._tracker_handle = None
        if self._originals is not None:
            import torch

            torch.save, torch.load = self._originals
            self._originals = None

    # --- writing and reading FILE ---------------------------------------------------

    def _keyed(self) -> dict[str, Any]:
        return keyed_by_state_key(self.callbacks or ())

    def _record(self) -> dict[str, Any]:
        """FILE's checkpoints: path -> the checkpoint's stamp and the callbacks' state
        when it was saved (read once, then kept up to date here)."""
        if self._checkpoints is None:
            from ._plain import weights_only_load

            record: Any = {}
            if os.path.isfile(self.path):
                record = weights_only_load(self.path, f"{PROG} --state {self.path}")
                if not isinstance(record, dict) or not isinstance(record.get("checkpoints"), dict):
                    raise HookError(f"{PROG}: --state {self.path}: not a state file hookwrap run wrote. Give "
                                    f"another path, or remove it.")
            self._checkpoints = dict(record.get("checkpoints", {}))
        return self._checkpoints

    def _write(self, checkpoint: str) -> None:
        from ._plain import check_plain
        from .torch.checkpoint_io import CheckpointIO

        state = self._state_now()
        check_plain(state, f"{PROG} --state", "the callbacks' state")
        checkpoints = self._record()
        checkpoints[checkpoint] = {"stamp": _stamp(checkpoint), "callbacks": state,
                                   "before_evaluation": self._before_evaluation}
        CheckpointIO().save({"checkpoints": checkpoints}, Path(self.path))  # whole or not at all, synced

    def _loaded(self, checkpoint: str) -> None:
        saved = self._record().get(checkpoint)
        if saved is None:
            return  # a file the script loads that no state goes with (its data, a tokenizer)
        if saved["stamp"] != _stamp(checkpoint):
            print(f"{PROG}: --state {self.path}: {checkpoint} changed since the callbacks' state was saved with "
                  f"it (a save that ended before the state's): the callbacks start afresh.", file=sys.stderr)
            return
        self._pending = saved["callbacks"]
        self._redo = saved.get("before_evaluation")
        self.restored_from = checkpoint
        if self.callbacks is not None:
            self._restore()

    def attach(self, callbacks: list[Any]) -> None:
        """The run's callbacks, registered: a state loaded already goes to them now.
        With ``step`` and ``evaluate`` join points, what follows the run's evaluations
        and steps is registered too (until ``remove()``)."""
        from ._callback import register_global_callback
        from ._joinpoints import all_join_points

        self.callbacks = callbacks
        events = {jp.event for jp in all_join_points()}
        training = "step" if "step" in events else "loss" if "loss" in events else None
        if "evaluate" in events and self._keyed():
            self._tracker = _EvaluationsAndSteps(self, training)
            self._tracker_handle = register_global_callback(self._tracker)
        if self._pending is not None:
            self._restore()

    def _state_now(self) -> dict[str, Any]:
        return {key: cb.state_dict() for key, cb in self._keyed().items()}

    def before_evaluation(self) -> None:
        if self._redo is not None:  # restored, and no step since: this evaluation is the checkpoint's, redone
            state, self._redo = self._redo, None
            for key, cb in self._keyed().items():
                cb.load_state_dict(state[key])
            print(f"{PROG}: --state: the first evaluation after the resume redoes the one {self.restored_from} "
                  f"was saved after; it decides in its place.", file=sys.stderr)
        self._before_evaluation = copy.deepcopy(self._state_now())

    def after_step(self) -> None:
        self._before_evaluation = self._redo = None

    def _restore(self) -> None:
        state, self._pending = self._pending, None
        assert state is not None
        load_keyed_state(self._keyed(), state, f"{PROG}: --state {self.path} (saved with {self.restored_from})",
                         "Resume with the --callback options of the run that saved it, or give another --state "
                         "file to start afresh.")
        if self._redo is not None and (self._tracker is None or self._tracker.training is None):
            self._redo = None  # no step or loss join point: nothing tells a redone evaluation from the next one
            print(f"{PROG}: --state: {self.restored_from} was saved after an evaluation; if the script does it "
                  f"again, it counts twice (EarlyStopping's patience, a CSV row): nothing tells training apart "
                  f"here. Give the run a step join point (--preset torch_optim) or its loss (--weave "
                  f"loss=MODULE:FUNCTION).", file=sys.stderr)
        print(f"{PROG}: the callbacks' state goes on from {self.path} (saved with {self.restored_from})",
              file=sys.stderr)


class _EvaluationsAndSteps(Callback):
    """Tells ``ScriptState`` when an evaluation begins and training goes on: a step
    ends, or (``training="loss"``) a loss is computed with gradients enabled (None:
    nothing marks training, and a resume says what that costs)."""

    def __init__(self, state: ScriptState, training: str | None) -> None:
        self.state, self.training = state, training  # None: no join point marks training

    def event_methods(self, target: Any) -> list[tuple[str, Any]]:
        from .extend import reader

        pairs = [("pre-evaluate", reader(self._evaluation, "pre-"))]
        if self.training is not None:
            step = self._loss if self.training == "loss" else self._step
            pairs.append((f"post-{self.training}", reader(step, "post-")))
        return pairs

    def _evaluation(self, obj: Any) -> None:
        self.state.before_evaluation()

    def _step(self, obj: Any) -> None:
        self.state.after_step()

    def _loss(self, obj: Any) -> None:
        import torch

        if torch.is_grad_enabled():  # training's, not an evaluation's under no_grad
            self.state.after_step()
