"""``Checkpoint(resume_from=...)`` under ``hookwrap run``, where the script is the run.

A module-level loop cannot be started at step N: its counter, its data iterator and
whatever else it keeps are the script's own. So the resumed run replays it: the script
runs from its first line as before, and each optimizer step up to the checkpoint's
step N is skipped (its forward and backward run, its update does not, so the random
numbers are drawn as before and the data come in the same order). Right after the
N-th, the checkpoint is loaded (weights, optimizer, scheduler, RNG states, the
callbacks' state), the run starts for the callbacks (``pre-fit``) and goes on as the
run that saved it would have.

From the first step until then the callbacks are held off (a ``when`` filter), and so
are the script's output (``sys.stdout``) and its own saves (``torch.save``, and
``open`` for writing in the script itself): they would log, print and save what a
model that never trained computes, over the files of the run being resumed."""

from __future__ import annotations

import builtins
import os
import sys
import time
from typing import Any, Callable

from ._callback import Callback, keyed_by_state_key, load_keyed_state

__all__ = ["BadReplay", "HeldOff", "Replay", "RunState", "plan_replay"]

PROG = "hookwrap run"


class BadReplay(Exception):
    """A resume that cannot work: the runner reports it as bad input."""


def plan_replay(callbacks: list[Any], whens: list[Any], exprs: list[Any], script_is_fit: bool,
                state_option: str | None, events: Callable[[], set[str]]) -> Replay | None:
    """The replay a ``Checkpoint(resume_from=...)`` among ``callbacks`` asks for, with
    the step it resumes at read from its file; None when there is nothing to replay
    (no such Checkpoint, a ``fit`` join point of the script's own, or ``"last"``/
    ``"best"`` not saved yet: the run starts afresh). Raises ``BadReplay`` naming the
    fix for what can never work."""
    module = sys.modules.get("hookwrap.torch.checkpoint")  # only a torch run has a Checkpoint
    if module is None or not script_is_fit:
        return None
    resuming = [(cb, when, expr) for cb, when, expr in zip(callbacks, whens, exprs)
                if isinstance(cb, module.Checkpoint) and cb.resume_from is not None]
    if not resuming:
        return None
    if len(resuming) > 1:
        raise BadReplay(f"--callback {resuming[1][2]!r}: {len(resuming)} Checkpoints have resume_from; one run "
                        f"resumes from one file. Give resume_from to one of them.")
    checkpoint, when, expr = resuming[0]
    where = f"--callback {expr!r}"
    if state_option is not None:
        raise BadReplay(f"{where}: resume_from and --state {state_option} both resume the callbacks, from two "
                        f"files. Resume from the Checkpoint's file (leave --state out), or resume the script its "
                        f"own way with --state (leave resume_from out).")
    from .torch._attach import is_reference

    for what in ("model", "optimizer"):
        setting = getattr(checkpoint, what)
        if isinstance(setting, str) and not is_reference(setting):
            raise BadReplay(f"{where}: {what}={setting!r} is read from the run's join point, and a script's run "
                            f"has no object to read it from. Name the script's global: {what}='__main__:{setting}'.")
    step_event = checkpoint.step_event
    if step_event not in events():  # the join points' names, gathered only where a resume asks
        raise BadReplay(f"{where}: resume_from on a script replays its first steps without their updates to reach "
                        f"the saved one, and no join point is {step_event!r}. Add --preset torch_optim (each "
                        f"optimizer's step), or --weave {step_event}=MODULE:FUNCTION.")
    file = checkpoint.resolve(checkpoint.resume_from)
    named = str(checkpoint.resume_from)
    if file is None or not checkpoint.io.exists(file):
        if named in ("last", "best"):  # as Checkpoint's own resume_from: nothing saved yet, a fresh run
            print(f"{PROG}: {where}: no {named} checkpoint saved yet: the run starts afresh.", file=sys.stderr)
            return None
        raise BadReplay(f"{where}: no checkpoint to resume from at {str(file) if file else named!r}. Name a file "
                        f"a Checkpoint saved (resume_from='last' starts afresh when there is none).")
    saved = checkpoint.io.load(file, map_location="cpu")
    steps = saved.get("step") if isinstance(saved, dict) else None
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1 or not isinstance(saved.get("callbacks"), dict):
        raise BadReplay(f"{where}: {str(file)!r} holds no completed step to resume after (step {steps!r}): start "
                        f"the run afresh, without resume_from.")
    return Replay(checkpoint, str(file), steps, saved["callbacks"], when, where)


class RunState:
    """The state of a script run's callbacks (``--callback``, each by its state key),
    which a ``Checkpoint`` of the run saves in its files and gives back on a resume
    (``Checkpoint.run_state``): the script's run has no object to find them on."""

    def __init__(self, callbacks: list[Any]) -> None:
        self.callbacks = callbacks

    def keys(self) -> set[str]:
        return set(keyed_by_state_key(self.callbacks))

    def state(self) -> dict[str, Any]:
        return {key: cb.state_dict() for key, cb in keyed_by_state_key(self.callbacks).items()}

    def load(self, state: dict[str, Any], strict: bool, where: str) -> None:
        load_keyed_state(keyed_by_state_key(self.callbacks), state, f"{where}: the callbacks of {PROG}",
                         "Resume with the --callback options of the run that saved it." if strict else None)

    def replayed(self) -> None:
        """Loaded after a replay: everything from the saved step on is logged again."""
        for cb in self.callbacks:
            redo = getattr(type(cb), "redo_from_resumed_step", None)
            if redo is not None:
                redo(cb)


class Replay(Callback):
    """Skips the script's first ``steps`` optimizer steps (those ``counts`` keeps, as
    the Checkpoint counted them), then loads the checkpoint and starts the run."""

    def __init__(self, checkpoint: Any, file: str, steps: int, callbacks_state: dict[str, Any],
                 counts: Callable[[Any], bool] | None, where: str) -> None:
        self.checkpoint, self.file, self.steps, self.counts, self.where = checkpoint, file, steps, counts, where
        self.callbacks_state = callbacks_state
        self.replaying = True
        self.counted = 0
        self.begin_run: Callable[[], None] = lambda: None  # the script's run starts: pre-fit
        self.module_of: Callable[[], Any] = lambda: None  # the script's module, where its own open() is held off
        self._held: HeldOff | None = None
        self._lines_at_arrival = 0
        self._started = 0.0
        self.handle: Any = None  # its registration, removed once arrived
        self.run_state: RunState | None = None  # the run's callbacks, whose state the Checkpoint loads

    # --- what the runner asks -------------------------------------------------------------

    def held_off(self, when: Callable[[Any], bool] | None) -> Callable[[Any], bool]:
        """A callback's ``when``: never while replaying, then ``when``."""
        if when is None:
            return lambda obj: not self.replaying
        return lambda obj: not self.replaying and when(obj)

    def check_callbacks(self, run_state: RunState) -> None:
        """Before the script runs: the run's callbacks are those whose state the file
        holds, or the resume could never load it."""
        self.run_state = run_state
        keys, saved = run_state.keys(), set(self.callbacks_state)
        if keys != saved:
            raise BadReplay(f"{self.where}: {self.file} holds the state of "
                            f"{', '.join(map(repr, sorted(saved))) or 'no callback'}, and this run's callbacks "
                            f"are {', '.join(map(repr, sorted(keys))) or 'none with state'}. Resume with the "
                            f"--callback options of the run that saved it.")

    def end(self, ended_normally: bool) -> None:
        """The script ended: what was held off is put back; ending before the saved
        step is said (a run that could not reach it is no resume)."""
        if not self.replaying:
            self._show_output()  # the lines since the saved step, said as they are held off
        self._release()
        replaying, self.replaying = self.replaying, False
        if replaying and ended_normally:
            raise BadReplay(f"{self.where}: {self.file} was saved after step {self.steps}, and the script ended "
                            f"after {self.counted}: it could not be replayed to where it was saved. Run it with "
                            f"the arguments and data of the run that saved it.")

    # --- the steps ------------------------------------------------------------------------

    def event_methods(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        from .extend import per_join_point

        return [(f"around-{self.checkpoint.step_event}", per_join_point(self, "skip_update", self._choose))]

    def _choose(self, jp: Any) -> Callable[..., Any]:
        from .torch.skip_bad_steps import closure_position

        closure = closure_position(jp)
        if jp.has_object:
            def skip_method(obj: Any, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
                return self._step(obj, closure, proceed, args, kwargs)

            return skip_method

        def skip_function(proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            return self._step(None, closure, proceed, args, kwargs)

        return skip_function

    def _step(self, obj: Any, closure: tuple[str, int] | None, proceed: Callable[..., Any],
              args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.replaying:
            self._show_output()  # the first step after the saved one: what it prints is this run's
            return proceed(*args, **kwargs)
        if self._held is None:  # the first step: what came before it is the same in both runs
            self._hold()
        result = None
        if closure is not None:  # the step's forward and backward (LBFGS), run as the step would
            import torch

            name, position = closure
            given = kwargs.get(name, args[position] if position < len(args) else None)
            if callable(given):
                with torch.enable_grad():
                    result = given()
        if self.counts is None or self.counts(obj):
            self.counted += 1
            if self.counted == self.steps:
                self._arrive()
        return result

    def _hold(self) -> None:
        self._started = time.perf_counter()
        print(f"{PROG}: resuming from {self.file}: replaying the script's first {self.steps} steps without their "
              f"updates (their output, the script's own saves and the callbacks held off until then)",
              file=sys.stderr)
        self._held = HeldOff(self.module_of())

    def _arrive(self) -> None:
        self.replaying = False
        held = self._held
        assert held is not None
        held.release_saves()
        # pre-fit: the Checkpoint's resume_from loads the weights, the optimizer, the RNG
        # states and the callbacks' state (Checkpoint.run_state).
        self.begin_run()
        if self.run_state is not None:
            self.run_state.replayed()
        saves = f"; its saves to {', '.join(sorted(held.saves))} skipped" if held.saves else ""
        print(f"{PROG}: resumed from {self.file} at step {self.steps} after "
              f"{time.perf_counter() - self._started:.1f} s of replay ({held.lines} lines of output held off"
              f"{saves})", file=sys.stderr)
        self._lines_at_arrival = held.lines
        # The output stays held until the next step: the saved step's own forward ran in the
        # replay, on weights that never trained, and a loop printing its loss after the
        # update (nanoGPT) would print that.

    def _show_output(self) -> None:
        held = self._held
        if held is None or held.output_released:
            return
        held.release()
        after = held.lines - self._lines_at_arrival
        if after:
            lines = "1 line" if after == 1 else f"{after} lines"
            print(f"{PROG}: {lines} the script printed between the saved step and the next held off too: the "
                  f"saved step's forward ran in the replay, so they may show its values (a loss printed after "
                  f"the update), not the run's.", file=sys.stderr)
        if self.handle is not None:
            self.handle.remove()  # nothing left to skip or hold: the steps run bare
            self.handle = None

    def _release(self) -> None:
        if self._held is not None:
            self._held.release()


class _Discarded:
    """``sys.stdout`` while replaying: the lines are counted, not shown."""

    def __init__(self, shown: Any) -> None:
        self.shown, self.lines = shown, 0

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, ...: the real stream's
        return getattr(self.shown, name)


class HeldOff:
    """The script's saves (``torch.save``; ``open`` for writing, in the script's
    module, opens the null device), and with ``output`` its ``sys.stdout``, held off
    from now until ``release()`` (once): what a replay (or a trace) must not write.
    ``saves`` names the files spared."""

    def __init__(self, module: Any, output: bool = True) -> None:
        import torch

        self.saves: set[str] = set()
        self.stdout = _Discarded(sys.stdout) if output else None
        if self.stdout is not None:
            sys.stdout = self.stdout
        self.torch, self.save = torch, torch.save
        saves = self.saves

        save = torch.save

        def skipped_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            if isinstance(f, (str, os.PathLike)):
                saves.add(os.fspath(f))
                return
            # A file the script opened (held_open: the null device) or a buffer it reads
            # back (io.BytesIO): written as asked, no file of the run's changes.
            save(obj, f, *args, **kwargs)

        torch.save = skipped_save
        self.module = module if module is not None and "open" not in vars(module) else None
        if self.module is not None:
            def held_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
                if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+"):
                    saves.add(os.fspath(file))  # opened to write: to nowhere, the file kept as it is
                    return builtins.open(os.devnull, mode.replace("x", "w"), *args, **kwargs)
                return builtins.open(file, mode, *args, **kwargs)

            vars(self.module)["open"] = held_open
        self.saves_released = self.output_released = False

    @property
    def lines(self) -> int:
        return self.stdout.lines if self.stdout is not None else 0

    def release_saves(self) -> None:
        if self.saves_released:
            return
        self.saves_released = True
        self.torch.save = self.save
        if self.module is not None:
            vars(self.module).pop("open", None)

    def release(self) -> None:
        """The saves and the output, both put back."""
        self.release_saves()
        if not self.output_released:
            self.output_released = True
            if self.stdout is not None and sys.stdout is self.stdout:
                sys.stdout = self.stdout.shown
