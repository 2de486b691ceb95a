"""``hookwrap run``: run a training script you cannot edit, with weaves and callbacks
applied from outside.

    hookwrap run [--preset NAME]... [--weave [EVENT=]MODULE:ATTR]... [--train-only EVENT]...
                 [--callback EXPR]... script.py [args...]

The script runs as ``python script.py args`` (and ``python -m cProfile``) runs it:
``sys.argv`` is ``[script.py, args...]``, ``__name__ == "__main__"`` (its module is
``sys.modules["__main__"]`` while it runs, so what it pickles pickles), its
directory comes first on ``sys.path``, and its exit status is kept (``sys.exit``
codes; an uncaught exception prints its traceback and exits 1).

``--weave`` targets:

* ``MODULE:FUNCTION`` and ``MODULE:CLASS.METHOD`` (``CLASS.INNER.METHOD``): the
  module is imported before the script runs, and woven there.
* ``__main__:NAME`` / ``__main__:CLASS.METHOD`` (or ``:NAME``; or the script's own
  module name): the script's functions and classes. They exist only once the
  script defines them, so the script is compiled with a weave right after the
  top-level statement that last binds ``NAME`` (a ``def``, ``class``, import or
  assignment). When that statement is an ``if``, ``try``, ``with``, ``for`` or
  ``while``, the weave comes also right after the last binding in each of its
  blocks: a ``def`` inside ``if __name__ == "__main__":`` is woven before the rest
  of that block runs. The line numbers of tracebacks are the script's own.
* ``EVENT=`` names the join point (``epoch=__main__:train``); by default it is
  the attribute's name.

``--callback EXPR`` is evaluated with ``hw`` (hookwrap) and every name of
``hookwrap.torch`` in scope, and the modules it names imported
(``mypackage.callbacks.Saver()``; an import that fails is reported as itself), and registered on the global tier once every weave
has been applied: before the script runs, checked against stand-ins of the script's
own targets made from their ``def`` lines (``_script_source``), or, where its source
does not settle one, when the script has defined the last of them; a value naming the script's own object
(``BestCheckpoint(..., model="__main__:model")``) is looked up when first needed.
``--train-only EVENT``: the function woven as EVENT fires callbacks only while
gradients are enabled (an evaluation under ``torch.no_grad()`` calls it plain);
``--only 'EVENT: CONDITION'`` only when CONDITION, an expression of the call's
arguments and the script's globals, is true (``'evaluate: data_source is val_data'``).
A ``StopTraining`` a callback raises ends the script: a line saying why on stderr,
exit status 0. ``--stop-as EXCEPTION`` (``KeyboardInterrupt``, or ``MODULE:NAME``)
delivers it to the script as that exception instead, raised from the call of the
``--weave`` join point where the stop was decided, so a script that leaves training
early its own way (``except KeyboardInterrupt:``) runs its ending (loading its best
model, a test evaluation). ``--state FILE``: each ``torch.save`` of the script writes
the callbacks' state to FILE, and its ``torch.load`` of that same checkpoint (its own
resume) gives it back (``_script_state``); ``Checkpoint(resume_from=...)`` on the
script's run replays its first steps without their updates and loads the file right
after the saved one (``_script_replay``). Callbacks with a ``summary()`` (``StepTimer``, ``Throughput``)
print it at the end. Bad input exits with status 2 and a message naming it
and the fix, before the script runs wherever that can be known.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from types import CodeType, ModuleType, TracebackType
from typing import Any, Callable, Sequence

from ._callback import Callback, boundary
from ._paths import relative_to
from ._script_replay import BadReplay, HeldOff, RunState, plan_replay
from ._script_source import inject, last_bindings, stand_in, top_level_names
from .errors import HookError, StopTraining, UnknownEventError, closest

__all__ = ["BadInput", "Runner", "WeaveTarget", "parse_weave", "run"]

PROG = "hookwrap run"
MAIN_ALIASES = ("__main__", "")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_IDENT}(?:\.{_IDENT})*"
_WEAVE = re.compile(rf"(?:(?P<event>{_IDENT})=)?(?P<module>{_DOTTED}|)(?::(?P<attr>{_DOTTED}))?")


class BadInput(SystemExit):
    """Bad input to ``hookwrap run``: exits with status 2 after printing ``message``.
    A ``SystemExit``, so a script's ``except Exception`` does not swallow it when it is
    found inside the run (a script target that turned out not to be weavable)."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message


@dataclass
class WeaveTarget:
    """One ``--weave``: ``event`` (None: the attribute's name), ``module`` (``__main__``
    for the script), the ``path`` to its container inside the module (empty: the
    module itself) and the attribute woven."""

    spec: str
    event: str | None
    module: str
    path: list[str]
    attr: str

    @property
    def in_script(self) -> bool:
        return self.module == "__main__"

    @property
    def top_name(self) -> str:
        """The top-level name of the script that must exist for this weave."""
        return (self.path or [self.attr])[0]


def parse_weave(spec: str) -> WeaveTarget:
    match = _WEAVE.fullmatch(spec.strip())
    if match is None or match["attr"] is None:
        raise BadInput(
            f"{PROG}: --weave {spec!r}: not a target. Write MODULE:FUNCTION or MODULE:CLASS.METHOD, "
            f"optionally EVENT= first (--weave loss=torch.nn.functional:nll_loss, "
            f"--weave epoch=__main__:train for the script's own function)."
        )
    module = match["module"]
    if module in MAIN_ALIASES:
        module = "__main__"
    *path, attr = match["attr"].split(".")
    return WeaveTarget(spec, match["event"], module, path, attr)


@dataclass
class Runner:
    """One ``hookwrap run``: what it applied, so that it can undo it all."""

    script: str
    args: list[str]
    presets: list[str] = field(default_factory=list)
    weaves: list[WeaveTarget] = field(default_factory=list)
    callback_exprs: list[str] = field(default_factory=list)
    train_only: list[str] = field(default_factory=list)  # events whose woven functions fire only with grad on
    only: list[str] = field(default_factory=list)  # "EVENT: EXPR": a woven function fires when EXPR is true
    stop_as: str | None = None  # --stop-as: the exception a stop is delivered to the script as
    _stop_as: Any = None  # its class, resolved before the script runs
    stopped: list[str] = field(default_factory=list)  # stops delivered as _stop_as: why
    state: str | None = None  # --state FILE: the callbacks' state rides on the script's checkpoints
    step: str | None = None  # --step EXPR: the script's own counter numbers the MetricsLoggers' rows
    when: list[str | None] = field(default_factory=list)  # --when: each --callback's condition, or None
    _state: Any = None  # its ScriptState, installed before the script runs
    _conditions: dict[str, str] = field(default_factory=dict)  # event -> the EXPR of --only
    _fired: dict[str, str] = field(default_factory=dict)  # event -> its --weave, until it fires
    handles: list[Any] = field(default_factory=list)  # weaves and registrations, to remove
    callbacks: list[Any] = field(default_factory=list)
    module: ModuleType | None = None
    _pending_script: dict[str, list[WeaveTarget]] = field(default_factory=dict)
    # A script name woven: its targets, their handles, and the object it was bound to
    # then (bound anew, in a loop's body, it is woven anew).
    _script_targets: dict[str, list[WeaveTarget]] = field(default_factory=dict)
    _script_handles: dict[str, list[Any]] = field(default_factory=dict)
    _woven: dict[str, Any] = field(default_factory=dict)
    _registered = False
    _attached: list[Any] = field(default_factory=list)  # the callbacks registered (their summaries are said)
    _when: list[Any] = field(default_factory=list)  # the --when conditions, compiled
    _sinks: set[int] = field(default_factory=set)  # ids of the MetricsLoggers other callbacks log into
    _fit: Any = None  # the script's run as join point "fit": its generator, running (ScriptRun)
    # name -> (weave handle, join point) of each stand-in of a script target not defined yet
    _stand_ins: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)
    _callback_handles: list[tuple[str, Any]] = field(default_factory=list)  # (--callback, its handle)
    _replay: Any = None  # Checkpoint(resume_from=) on the script's run: its first steps replayed (Replay)

    # --- before the script -------------------------------------------------------

    def prepare(self) -> CodeType:
        """Check everything that can be checked, apply presets and module weaves,
        evaluate the callbacks; returns the script's code, instrumented."""
        path = self.script
        if not os.path.isfile(path):
            raise BadInput(f"{PROG}: {path!r}: no such file. Give the path of the script to run.")
        with open(path, "rb") as f:
            source = f.read()
        tree = ast.parse(source, path)  # a SyntaxError is reported as python would report it
        self._alias_script_module()
        for target in self.weaves:
            if target.in_script:
                self._pending_script.setdefault(target.top_name, []).append(target)
        woven_events = {target.event or target.attr for target in self.weaves}
        for spec in self.only:
            event, colon, condition = spec.partition(":")
            event, condition = event.strip(), condition.strip()
            if not colon or not event or not condition:
                raise BadInput(f"{PROG}: --only {spec!r}: write EVENT: CONDITION, a Python expression of the "
                               f"woven function's arguments and the script's globals "
                               f"(--only 'evaluate: data_source is val_data').")
            try:
                compile(condition, f"--only {spec}", "eval")
            except SyntaxError as exc:
                raise BadInput(f"{PROG}: --only {spec!r}: the condition is not a Python expression ({exc.msg}).") \
                    from None
            self._conditions[event] = condition
        self._when = [None if condition is None else _callback_condition(condition, expr)
                      for expr, condition in zip(self.callback_exprs, self.when)]
        for option, events in (("--train-only", self.train_only), ("--only", list(self._conditions))):
            for event in events:
                if event not in woven_events:
                    raise BadInput(
                        f"{PROG}: {option} {event!r}: no --weave makes a join point {event!r}."
                        f"{closest(event, sorted(woven_events))} It applies to a function woven here "
                        f"(--weave {event}=MODULE:FUNCTION {option} {event}...).")
        positions = last_bindings(tree, set(self._pending_script))
        missing = sorted(set(self._pending_script) - set(positions))
        if missing:
            defined = sorted(top_level_names(tree))
            spec = self._pending_script[missing[0]][0].spec
            raise BadInput(
                f"{PROG}: --weave {spec!r}: {os.path.basename(path)} never defines {missing[0]!r} at its "
                f"top level.{closest(missing[0], defined)} Its top-level names: "
                f"{', '.join(defined) or '(none)'}. Weave one of those, or the module that defines it "
                f"(MODULE:NAME)."
            )
        if self.stop_as is not None:
            self._stop_as = _exception_class(self.stop_as)
            if not self.weaves:
                raise BadInput(f"{PROG}: --stop-as {self.stop_as!r}: it delivers a stop decided on a join point "
                               f"--weave makes, and there is none. Weave the function the stop is decided on "
                               f"(--weave evaluate=__main__:evaluate).")
        if self.state is not None:
            self._install_state(self.state)
        self._apply_presets()
        for target in self.weaves:
            if not target.in_script:
                self._apply_module_weave(target)
        # Relative paths in them name files where the command ran, whatever folder the
        # script moves to before a callback opens them (_paths).
        with relative_to(os.getcwd()):
            self.callbacks = [self._evaluate(expr) for expr in self.callback_exprs]
        self._wire_loggers()
        if self.step is not None:
            self._number_rows_by(self.step)
        self._plan_replay()
        if self._pending_script:
            self._weave_stand_ins(tree)
        if not self._pending_script or self._stand_ins:
            self._register_callbacks()
        inject(tree, positions)
        # Named by its absolute path, as __file__ is: tracebacks find the source after a chdir.
        return compile(tree, os.path.abspath(path), "exec", dont_inherit=True)

    def _number_rows_by(self, expr: str) -> None:
        """``--step EXPR``: every MetricsLogger of the run numbers its rows by EXPR, an
        expression of the script's globals (``iter_num``) read when a row is logged."""
        try:
            code = compile(expr, f"--step {expr}", "eval")
        except SyntaxError as exc:
            raise BadInput(f"{PROG}: --step {expr!r}: not a Python expression ({exc.msg}). Name the script's "
                           f"own step counter (--step iter_num).") from None
        loggers = sys.modules.get("hookwrap.torch.metrics_logger")
        numbered = [cb for cb in self.callbacks if loggers is not None and isinstance(cb, loggers.MetricsLogger)]
        if not numbered:
            raise BadInput(f"{PROG}: --step {expr!r} numbers the rows of the run's MetricsLogger, and it has none. "
                           f"Add --callback 'MetricsLogger(\"metrics.csv\")'.")
        modules = sys.modules  # "__main__" is the script's only once it runs

        def counter() -> Any:
            try:
                return eval(code, vars(modules["__main__"]))  # noqa: S307 - the user's own
            except Exception as exc:
                raise HookError(f"{PROG}: --step {expr!r} failed when a row was logged: {type(exc).__name__}: "
                                f"{exc}. Name a global the script keeps its step in (nanoGPT: iter_num), bound "
                                f"before its first row.") from exc

        for cb in numbered:
            cb.step_from = counter

    def _plan_replay(self) -> None:
        from ._joinpoints import all_join_points

        def events() -> set[str]:
            return {jp.event for jp in all_join_points()} | {target.event or target.attr for target in self.weaves}

        try:
            self._replay = plan_replay(self.callbacks, self._when, self.callback_exprs, not self._makes_fit(),
                                       self.state, events)
        except BadReplay as exc:
            raise BadInput(f"{PROG}: {exc}") from None
        if self._replay is not None:
            self._replay.module_of = lambda: self.module

    def _weave_stand_ins(self, tree: ast.Module) -> None:
        """Join points in the place of the script's own functions, made from their
        ``def`` lines (``_script_source.stand_in``), so that the callbacks are
        registered, and refused, before the script runs; none where the source does
        not settle one of them (then they are registered once it has defined all)."""
        from ._hookable import weave
        from ._joinpoints import join_point_of

        made: dict[str, list[tuple[Any, Any]]] = {}
        for name, targets in self._pending_script.items():
            for target in targets:
                found = stand_in(tree, target.path, target.attr)
                handle = None
                if found is not None:
                    container, attr = found
                    try:
                        handle = weave(container, **{target.event or target.attr: attr})
                    except HookError:  # the real function's weave, when it is defined, says what is wrong
                        pass
                if handle is None:
                    for woven, _ in (pair for pairs in made.values() for pair in pairs):
                        woven.remove()
                    return
                made.setdefault(name, []).append((handle, join_point_of(vars(container)[attr])))
        self._stand_ins = made

    def _check_against_script(self, name: str, targets: list[WeaveTarget]) -> None:
        """The script has defined ``name`` and its ``targets`` are woven: a callback
        checked against their stand-ins must run on the real join points too (a
        decorator or a default the source did not show can change what they take)."""
        from ._joinpoints import join_point_of
        from ._registry import check_stand_in

        assert self.module is not None
        for target, (handle, stand_in_jp) in zip(targets, self._stand_ins.pop(name, [])):
            handle.remove()
            container: Any = self.module
            for part in target.path:
                container = getattr(container, part)
            real = join_point_of(vars(container)[target.attr], through_wrappers=True)
            for expr, registered in self._callback_handles:
                try:
                    check_stand_in(registered, stand_in_jp, real)
                except HookError as exc:
                    raise BadInput(f"{PROG}: --callback {expr!r}: {exc}") from None

    def _wire_loggers(self) -> None:
        """A callback that logs its values into a MetricsLogger (GradNorm, LRMonitor,
        MemoryMonitor) and was given none logs into the run's first --callback
        MetricsLogger: on a command line it cannot name one. With none, what it
        measures would reach nowhere: refused, naming the fix; so are two that would
        log under one name."""
        if "hookwrap.torch._attach" not in sys.modules:
            return  # no shipped callback among them
        from .torch.logs_into import LogsInto
        from .torch.metrics_logger import MetricsLogger

        loggers = [cb for cb in self.callbacks if isinstance(cb, MetricsLogger)]
        names: dict[tuple[int, str], int] = {}
        for i, (expr, cb) in enumerate(zip(self.callback_exprs, self.callbacks)):
            if not isinstance(cb, LogsInto):
                continue
            if cb.logger is None:
                if not loggers:
                    raise BadInput(f"{PROG}: --callback {expr!r} logs what it measures into a MetricsLogger, and "
                                   f"this run has none: its values would reach nowhere. Add --callback "
                                   f"\"MetricsLogger('metrics.csv')\" (it logs into the first one).")
                cb.logger = loggers[0]
            self._sinks.add(id(cb.logger))
            name = getattr(cb, "name", None)
            if name is None:
                continue
            other = names.setdefault((id(cb.logger), name), i)
            if other != i:
                raise BadInput(f"{PROG}: --callback {self.callback_exprs[other]!r} and --callback {expr!r} both log {name!r} into one "
                               f"MetricsLogger, so their rows could not be told apart: give each its own name "
                               f"(name='{name}_2').")

    def _install_state(self, path: str) -> None:
        from ._script_state import ScriptState

        if os.path.isdir(path):
            raise BadInput(f"{PROG}: --state {path!r} is a folder. Give the path of a file (run.state.pt).")
        try:
            import torch  # noqa: F401
        except ImportError:
            raise BadInput(f"{PROG}: --state needs torch (it rides on torch.save and torch.load).") from None
        state = ScriptState(path)
        try:
            state._record()  # a file there already must be one hookwrap wrote: said now, not mid-run
        except HookError as exc:
            raise BadInput(str(exc)) from None
        state.install()
        self._state = state

    def _alias_script_module(self) -> None:
        """``--weave train:fn`` where ``train`` is the script itself: its ``__main__``."""
        script = os.path.realpath(self.script)
        stem = os.path.splitext(os.path.basename(script))[0]
        for target in self.weaves:
            if target.module == stem:
                try:
                    spec = importlib.util.find_spec(stem)
                except (ImportError, ValueError):
                    continue
                if spec is not None and spec.origin and os.path.realpath(spec.origin) == script:
                    target.module = "__main__"

    def _apply_presets(self) -> None:
        from .integrations import PRESETS, FrameworkMissing, install_command, load

        for name in dict.fromkeys(self.presets):  # a preset in the run file and on the command line: once
            key = name.replace("-", "_")
            if key not in PRESETS:
                raise BadInput(
                    f"{PROG}: --preset {name!r}: no such preset.{closest(key, list(PRESETS))} "
                    f"Presets: {', '.join(sorted(PRESETS))}. Or weave what you need with --weave."
                )
            try:
                self.handles.append(load(key)())
            except FrameworkMissing as missing:  # said by the preset (needs_framework); anything else goes on
                raise BadInput(f"{PROG}: --preset {name!r} needs {missing.missing}, which is not "
                               f"installed here: install it ({install_command(key)}, or your own version of "
                               f"{missing.missing}).") from None
            except HookError as exc:
                raise BadInput(f"{PROG}: --preset {name!r}: {exc}") from None

    def _apply_module_weave(self, target: WeaveTarget) -> None:
        try:
            module = importlib.import_module(target.module)
        except ImportError as exc:
            raise BadInput(
                f"{PROG}: --weave {target.spec!r}: cannot import {target.module!r} ({exc}). Check the "
                f"module name; for the script's own functions write __main__:NAME."
            ) from None
        self._weave(target, module)

    def _weave(self, target: WeaveTarget, module: ModuleType) -> None:
        from ._hookable import weave

        container: Any = module
        where = target.module
        for part in target.path:
            try:
                container = getattr(container, part)
            except AttributeError:
                names = [n for n in dir(container) if not n.startswith("_")]
                raise BadInput(
                    f"{PROG}: --weave {target.spec!r}: {where} has no attribute {part!r}."
                    f"{closest(part, names)} Name a class of it (MODULE:CLASS.METHOD)."
                ) from None
            where = f"{where}.{part}"
        if not isinstance(container, (type, ModuleType)):
            raise BadInput(
                f"{PROG}: --weave {target.spec!r}: {where} is a {type(container).__name__}, not a class "
                f"or module. Write MODULE:FUNCTION or MODULE:CLASS.METHOD."
            )
        try:
            if target.event is None or target.event == target.attr:
                handle = weave(container, target.attr)
            else:
                handle = weave(container, **{target.event: target.attr})
        except HookError as exc:
            raise BadInput(f"{PROG}: --weave {target.spec!r}: {exc}") from None
        self.handles.append(handle)
        if self._stop_as is not None:  # a stop raised through it leaves it as the script's own exception
            from .extend import guard

            guard(vars(container)[target.attr] if isinstance(container, type) else getattr(container, target.attr),
                  self._deliver_stop)
        event = target.event or target.attr
        if event in self.train_only or event in self._conditions:
            self.handles.append(_Gate(target, container, event in self.train_only, self._conditions.get(event)))

    def _deliver_stop(self, obj: Any, stop: StopTraining, *call: Any) -> Any:
        """``--stop-as``: the join point's guard (run only when its callbacks run) turns
        a stop into the script's own early exit, chained to it."""
        self.stopped.append(str(stop))
        raise self._stop_as(f"{PROG}: stopped: {stop}") from stop

    def _evaluate(self, expr: Any) -> Any:
        import hookwrap

        from ._callback import Callback

        def is_callback(value: Any) -> bool:  # what register_global_callback takes
            return isinstance(value, Callback) or (isinstance(value, tuple) and len(value) == 2)

        if not isinstance(expr, str):  # run(callbacks=[StepTimer()]): an object already
            if is_callback(expr):
                return expr
            raise BadInput(f"{PROG}: callback {expr!r} is not a hookwrap.Callback or an ('event', fn) pair.")

        scope: dict[str, Any] = {"hw": hookwrap, "hookwrap": hookwrap}
        shipped_error: Exception | None = None
        try:
            import hookwrap.torch as shipped

            scope.update((name, getattr(shipped, name)) for name in shipped.__all__)
        except ImportError as exc:  # without torch: hw.* and modules; named if a name is missing
            shipped_error = exc
        filename = f"--callback {expr}"
        try:
            tree = ast.parse(expr, filename, mode="eval")
        except SyntaxError as exc:
            raise _bad_expression(expr, exc, scope, None) from None
        _import_modules(expr, tree, scope)
        _load_entry_points(expr, tree, scope)
        try:
            value = eval(compile(tree, filename, "eval"), scope)  # noqa: S307 - the user's own
        except Exception as exc:
            raise _bad_expression(expr, exc, scope, shipped_error) from None
        if isinstance(value, type) and issubclass(value, Callback):
            try:
                value = value()
            except TypeError as exc:
                raise BadInput(f"{PROG}: --callback {expr!r}: {exc}; call it with its arguments.") from None
        if not is_callback(value):
            raise BadInput(
                f"{PROG}: --callback {expr!r} is a {type(value).__name__}, not a callback. Give a "
                f"hookwrap.Callback (StepTimer(), NanGuard(events='loss')) or an ('event', fn) pair."
            )
        return value

    def _register_callbacks(self) -> None:
        from ._callback import register_global_callback

        self._registered = True
        if not self._makes_fit():
            self._fit = ScriptRun.make()  # before the callbacks: they find join point "fit"
        replay = self._replay
        if replay is not None:  # the first steps skipped, the callbacks held off until the saved one
            replay.handle = register_global_callback(replay)
            self.handles.append(replay.handle)
            replay.begin_run = self._fit.begin
        for target in self.weaves:  # a join point the script never calls is said at the end
            event = target.event or target.attr
            if event not in self._fired:
                handle = register_global_callback(_Fired(event, self._fired), once=True)
                self.handles.append(handle)  # removed with the rest, however the run ends
                self._fired[event] = target.spec
        for expr, cb, when in zip(self.callback_exprs, self.callbacks, self._when):
            if id(cb) in self._sinks and not cb.logs_rows_of(None):
                self._attached.append(cb)  # only other callbacks' values: not attached (its state still kept)
                continue
            if replay is not None:
                when = replay.held_off(when)
            try:
                handle = register_global_callback(cb) if when is None else register_global_callback(cb, when=when)
                self.handles.append(handle)
                self._callback_handles.append((expr, handle))
            except UnknownEventError as exc:
                fix = ("--preset torch_optim names each optimizer's step 'step': pass event='step' (and "
                       "step_event=None, or a step of the script's own)" if "torch_optim" in
                       {p.replace("-", "_") for p in self.presets} and "optimizer_step" in str(exc)
                       else "Make the join points it needs with --weave EVENT=MODULE:ATTR or --preset torch_optim")
                raise BadInput(f"{PROG}: --callback {expr!r}: {exc} {fix}.") from None
            except HookError as exc:
                raise BadInput(f"{PROG}: --callback {expr!r}: {exc}") from None
            self._attached.append(cb)
        if self._state is not None:
            self._state.attach(self._attached)
        if self._fit is not None:  # the script is the run: a Checkpoint saves its callbacks' state
            run_state = RunState(self._attached)
            checkpoints = sys.modules.get("hookwrap.torch.checkpoint")
            for cb in self._attached:
                if checkpoints is not None and isinstance(cb, checkpoints.Checkpoint):
                    cb.run_state = run_state
        if replay is not None:
            try:
                replay.check_callbacks(run_state)
            except BadReplay as exc:
                raise BadInput(f"{PROG}: {exc}") from None
        elif self._fit is not None:
            self._fit.begin()

    def _makes_fit(self) -> bool:
        """Does a preset or a --weave of this run make join point ``fit``?"""
        return any((target.event or target.attr) == "fit" for target in self.weaves) or any(
            "fit" in getattr(handle, "events", {}) for handle in self.handles)

    def end_run(self, exc: BaseException | None) -> None:
        """The script ended (``exc`` None: normally, or by a stop or ``sys.exit(0)``):
        so does its ``fit``."""
        fit, self._fit = self._fit, None
        if fit is not None:
            fit.end(exc)
        if self._replay is not None:
            try:
                self._replay.end(ended_normally=exc is None)
            except BadReplay as bad:
                raise BadInput(f"{PROG}: {bad}") from None

    # --- while the script runs ---------------------------------------------------

    def defined(self, name: str, final: bool = True) -> None:
        """Called by the instrumented script right after it last binds ``name`` (in
        each block of a compound statement, and after the statement: ``final``)."""
        module = self.module
        assert module is not None
        if name not in vars(module):  # a branch that binds it did not run (yet)
            if final and name in self._pending_script:
                target = self._pending_script[name][0]
                raise BadInput(
                    f"{PROG}: --weave {target.spec!r}: {os.path.basename(self.script)} did not define "
                    f"{name!r} on this run: the branch of its top-level statement that defines it did "
                    f"not run. Weave a name the script defines whichever way it runs, or run it so "
                    f"that it defines {name!r}."
                )
            return
        current = vars(module)[name]
        if name in self._woven and self._woven[name] is current:
            return  # woven already, as bound now
        targets = self._pending_script.pop(name, None)
        if targets is None:  # bound again since it was woven (a loop's body): weave the new one
            targets = self._script_targets[name]
            for handle in self._script_handles.pop(name, []):
                handle.remove()  # puts the earlier binding back: the script's own is kept
                self.handles.remove(handle)
            vars(module)[name] = current
        self._script_targets[name] = targets
        first = len(self.handles)
        for target in targets:
            self._weave(target, module)
        self._script_handles[name] = self.handles[first:]
        if name in self._stand_ins:
            self._check_against_script(name, targets)
        self._woven[name] = vars(module)[name]
        if not self._pending_script and not self._registered:
            self._register_callbacks()

    # --- after ----------------------------------------------------------------------

    def undo(self) -> None:
        if self._replay is not None:
            self._replay.end(ended_normally=False)  # what it held off put back, however the run ended
        self.end_run(None)  # a run that ended before its end was seen (BadInput mid-script)
        for handle, _ in (pair for pairs in self._stand_ins.values() for pair in pairs):
            handle.remove()
        self._stand_ins.clear()
        if self._state is not None:
            self._state.remove()
        for handle in reversed(self.handles):
            handle.remove()
        self.handles.clear()

    def summary(self) -> list[str]:
        """A line for each callback registered that reports what it measured
        (``summary()``: StepTimer, Throughput), and one for each woven join point the
        script never called (its callbacks never ran), printed to stderr at the end."""
        lines = [f"{PROG}: {cb.summary()}" for cb in self._attached if callable(getattr(cb, "summary", None))]
        for event, spec in self._fired.items():
            if self._attached:
                lines.append(f"{PROG}: --weave {spec!r}: join point {event!r} never fired, so no callback ran "
                             f"on it: the script never called it (it may call another function: nll_loss "
                             f"where cross_entropy was woven, or skip it on this run).")
        self._fired.clear()
        return lines


def _exception_class(spec: str) -> Any:
    """``--stop-as``'s exception class: a builtin's name or ``MODULE:NAME``."""
    import builtins

    module_name, colon, name = spec.rpartition(":")
    where = f"{PROG}: --stop-as {spec!r}"
    if not colon:
        found = getattr(builtins, spec, None)
        if found is None:
            raise BadInput(f"{where}: no built-in exception of that name.{closest(spec, dir(builtins))} Give "
                           f"KeyboardInterrupt (what a script that leaves training early on Ctrl-C catches), "
                           f"or MODULE:NAME for an exception of a module.")
    else:
        try:
            found = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as exc:
            raise BadInput(f"{where}: {exc}. Give MODULE:NAME of an exception class.") from None
    if not (isinstance(found, type) and issubclass(found, BaseException)) or issubclass(found, StopTraining):
        raise BadInput(f"{where}: not an exception class the script could catch instead of hookwrap's stop "
                       f"(got {found!r}). Give one such as KeyboardInterrupt.")
    return found


class _Fired(Callback):
    """Notes that join point ``event`` fired once (registered with ``once=True``: no
    cost after): ``fired`` then drops it from the runner's list of those to report."""

    def __init__(self, event: str, waiting: dict[str, Any]) -> None:
        self.event, self.waiting = event, waiting

    def event_methods(self, target: Any) -> list[tuple[str, Any]]:
        from .extend import reader

        return [(f"post-{self.event}", reader(self.fired, "post-"))]

    def fired(self, obj: Any) -> None:
        self.waiting.pop(self.event, None)


class _Gate:
    """``--train-only EVENT`` / ``--only 'EVENT: CONDITION'``: the woven function's
    attribute becomes a gate that calls the join point when the call counts (gradients
    enabled: training, not an evaluation under ``torch.no_grad()``; ``CONDITION``
    true, evaluated with the call's arguments by name and the script's globals) and
    the original function otherwise. ``remove()`` puts the join point back (before
    its weave is removed)."""

    def __init__(self, target: WeaveTarget, container: Any, train_only: bool, condition: str | None) -> None:
        import functools
        import inspect

        event = target.event or target.attr
        if isinstance(container, type):
            raise BadInput(f"{PROG}: --train-only/--only {event!r}: {target.spec!r} is a method; they gate "
                           f"functions. A loss module's forward (NLLLoss.forward) calls its functional, whose "
                           f"calls they gate: --weave {event}=torch.nn.functional:nll_loss (hookwrap trace "
                           f"names the one the script calls). Or keep a callback to some calls with --when.")
        is_grad_enabled: Any = None
        if train_only:
            try:
                import torch
            except ImportError:
                raise BadInput(f"{PROG}: --train-only needs torch (it reads torch.is_grad_enabled()).") from None
            is_grad_enabled = torch.is_grad_enabled
        joint = getattr(container, target.attr)
        original = joint.__wrapped__
        code = compile(condition, f"--only {event}: {condition}", "eval") if condition else None
        signature = inspect.signature(original) if code is not None else None
        modules = sys.modules  # "__main__" is the script's only once it runs

        @functools.wraps(joint)
        def gate(*args: Any, **kwargs: Any) -> Any:
            counts = is_grad_enabled is None or is_grad_enabled()
            if counts and code is not None:
                bound = signature.bind(*args, **kwargs)  # type: ignore[union-attr]
                bound.apply_defaults()  # an argument left to its default is named too
                try:
                    counts = bool(eval(code, vars(modules["__main__"]), bound.arguments))  # noqa: S307
                except Exception as exc:
                    raise HookError(f"{PROG}: --only '{event}: {condition}' failed on this call: "
                                    f"{type(exc).__name__}: {exc}. Write a condition of the arguments of "
                                    f"{target.spec} ({', '.join(bound.arguments)}) and the script's globals.") \
                        from exc
            return joint(*args, **kwargs) if counts else original(*args, **kwargs)

        self.container, self.attr, self.joint = container, target.attr, joint
        setattr(container, target.attr, gate)

    def remove(self) -> None:
        setattr(self.container, self.attr, self.joint)


ENTRY_POINTS = "hookwrap.callbacks"


def _load_entry_points(expr: str, tree: ast.Expression, scope: dict[str, Any]) -> None:
    """A name the expression uses that is not in scope, registered by an installed
    package in the ``hookwrap.callbacks`` entry-point group (``[project.entry-points.
    "hookwrap.callbacks"] Saver = "mypackage.callbacks:Saver"``), is loaded into scope:
    only the names used, so no other package is imported."""
    import builtins
    from importlib.metadata import entry_points

    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    wanted = sorted(n for n in names if n not in scope and not hasattr(builtins, n))
    if not wanted:
        return
    for point in entry_points(group=ENTRY_POINTS):
        if point.name in wanted and point.name not in scope:
            try:
                scope[point.name] = point.load()
            except Exception as exc:
                raise _import_failed(expr, point.value, exc, f"the {ENTRY_POINTS} entry point {point.name!r} "
                                     f"({point.dist.name if point.dist else 'a package'}): ") from None


class ScriptRun:
    """The script's run as join point ``fit`` (a generator join point, the object
    None), where no preset or weave makes one: callbacks that act at a run's start and
    end (``Checkpoint(on_signal=..., on_exception=True)``, the loggers' finalize) work
    on a module-level loop. It starts once the callbacks are registered, before the
    script or partway (when it defines a function woven), and ends with the script:
    ``error-fit`` for an exception leaving it, ``post-fit`` otherwise."""

    def __init__(self, join_point: Any) -> None:
        self.join_point: Any = join_point
        self.generator: Any = None

    @classmethod
    def make(cls) -> ScriptRun:
        from ._hookable import hookable

        def script() -> Any:
            yield

        return cls(hookable("fit")(script))

    def begin(self) -> None:
        self.generator = self.join_point()
        next(self.generator)  # pre-fit

    def end(self, exc: BaseException | None) -> None:
        from ._joinpoints import join_point_of, untrack_join_point

        if self.join_point is not None:  # the run's fit is over: no later registration finds it
            untrack_join_point(join_point_of(self.join_point))
        generator, self.generator, self.join_point = self.generator, None, None  # the join point goes with it
        if generator is None:
            return
        if exc is None:
            next(generator, None)  # post-fit
            return
        traceback = exc.__traceback__  # as the script raised it: the throw adds this module's frames
        try:
            generator.throw(exc)  # error-fit
        except BaseException as raised:
            if raised is not exc:
                raise
        finally:
            exc.__traceback__ = traceback


def _callback_condition(condition: str, expr: str) -> Callable[[Any], bool]:
    """``--callback EXPR --when CONDITION``: the callback fires on a call of a method
    only when CONDITION, a Python expression of ``obj`` (the object whose method was
    called: the optimizer, for --preset torch_optim's ``step``) and the script's
    globals, is true. Calls of functions (no object: the script's run, a woven
    function) are not filtered: the run's start and end reach every callback."""
    try:
        code = compile(condition, f"--when {condition}", "eval")
    except SyntaxError as exc:
        raise BadInput(f"{PROG}: --when {condition!r} (of --callback {expr!r}): not a Python expression "
                       f"({exc.msg}). Write a condition of obj and the script's globals "
                       f"(--when 'obj is optimizerD').") from None
    modules = sys.modules  # "__main__" is the script's only once it runs

    def when(obj: Any) -> bool:
        if obj is None:
            return True
        try:
            return bool(eval(code, vars(modules["__main__"]), {"obj": obj}))  # noqa: S307
        except Exception as exc:
            raise HookError(f"{PROG}: --when {condition!r} (of --callback {expr!r}) failed on this call: "
                            f"{type(exc).__name__}: {exc}. Write a condition of obj (here a "
                            f"{type(obj).__name__}) and the script's globals.") from exc
    return when


def _bad_expression(expr: str, exc: Exception, scope: dict[str, Any], shipped_error: Exception | None) -> BadInput:
    names = sorted(n for n in scope if not n.startswith("_"))
    if isinstance(exc, NameError) and exc.name and shipped_error is not None:
        # Its names were never put in scope: the import that failed is the error.
        return _import_failed(expr, "hookwrap.torch", shipped_error,
                              f"name {exc.name!r} is not defined, as hookwrap.torch, whose names --callback "
                              f"has in scope, did not import: ")
    hint = ""
    if isinstance(exc, NameError) and exc.name:
        # The installed packages' callbacks (entry points) are names it could mean too.
        from importlib.metadata import entry_points

        installed = sorted({point.name for point in entry_points(group=ENTRY_POINTS)} - set(names))
        names += installed
        hint = (f"{closest(exc.name, names)} A name of another module: write it with its module "
                f"(mypackage.callbacks.{exc.name}(...)), which hookwrap run imports.")
    return BadInput(
        f"{PROG}: --callback {expr!r}: {type(exc).__name__}: {str(exc).rstrip('.')}.{hint} Give a Python "
        f"expression making a callback, with these names in scope: {', '.join(names)} "
        f"(--callback \"NanGuard(events='loss')\")."
    )


def _import_failed(expr: str, module: str, exc: BaseException, lead: str = "") -> BadInput:
    """The error of an import the expression needs, as itself: its module, its
    message, and where it was raised."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
    where = ""
    if frames:
        file = os.path.basename(frames[-1].filename)
        if file == "__init__.py":  # say whose
            file = f"{os.path.basename(os.path.dirname(frames[-1].filename))}/{file}"
        where = f" ({file}, line {frames[-1].lineno})"
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        extra = " (hookwrap.torch needs torch: pip install 'hookwrap[torch]')" if exc.name == "torch" else ""
        fix = f"Install what provides {exc.name!r}{extra}, then run again."
    else:
        fix = "Fix the import it makes, then run again."
    return BadInput(f"{PROG}: --callback {expr!r}: {lead}importing {module!r} failed: "
                    f"{type(exc).__name__}: {str(exc).rstrip('.')}{where}. {fix}")


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ['a', 'b', 'c']; None for anything but a name and its attributes."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else [*base, node.attr]
    return None


def _import_modules(expr: str, tree: ast.Expression, scope: dict[str, Any]) -> None:
    """Import the modules the expression names (``mypackage.callbacks.Saver()``,
    ``hookwrap.integrations.x``), each part as far as it is a module; put a top-level
    one in scope. An import that fails inside the module is the error, as itself."""
    import builtins

    chains = {tuple(chain) for node in ast.walk(tree) if (chain := _dotted(node)) is not None}
    # A lambda's parameters and a comprehension's variables are the expression's own.
    own = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    own |= {arg.arg for node in ast.walk(tree) if isinstance(node, ast.arguments)
            for arg in (*node.posonlyargs, *node.args, *node.kwonlyargs, node.vararg, node.kwarg) if arg}
    for root, *rest in sorted(chains, key=len, reverse=True):
        if root in own:
            continue
        if root in scope:
            if not isinstance(scope[root], ModuleType):
                continue
            parts, first = scope[root].__name__.split("."), 1  # the module itself is imported
        elif hasattr(builtins, root):
            continue
        else:
            parts, first = [root], 0
        names = [".".join(parts + rest[:k]) for k in range(first, len(rest) + 1)]
        for name in names:  # a.b before a.b.c: a failing import is named as itself
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
                    break  # not a module: an attribute, or a name the expression lacks
                raise _import_failed(expr, name, exc) from None
            except Exception as exc:  # noqa: BLE001 - the module's own error, shown as itself
                raise _import_failed(expr, name, exc) from None
            if root not in scope:
                scope[root] = sys.modules[root]


_active: list[Runner] = []


def _defined(name: str, final: bool = True) -> None:
    _active[-1].defined(name, final)


def _script_traceback(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's first frame on (this module's frames dropped)."""
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def run(script: str, args: Sequence[str] = (), presets: Sequence[str] = (), weaves: Sequence[str] = (),
        callbacks: Sequence[Any] = (), train_only: Sequence[str] = (), only: Sequence[str] = (),
        stop_as: str | None = None, state: str | None = None, when: Sequence[str | None] = (),
        spared: set[str] | None = None, step: str | None = None) -> int:
    """Run ``script`` with ``args`` as ``python script.py args`` would, with the presets,
    weaves and callbacks applied, then undo them all; returns the exit status (the
    script's ``sys.exit`` code; 1 after printing an uncaught exception; 2 for bad
    input, printed to stderr). ``callbacks`` are ``--callback`` expressions, or
    callback objects (``Callback`` instances, ``("event", fn)`` pairs). ``train_only``:
    events of woven functions whose calls fire callbacks only with gradients enabled;
    ``only``: ``"EVENT: CONDITION"``, those that fire only when the condition holds.
    ``stop_as``: the exception a stop is delivered to the script as (``--stop-as``);
    ``state``: the file the callbacks' state rides on the script's checkpoints in
    (``--state``). ``when``: each callback's condition (``--when``) or None, in the
    order of ``callbacks``. ``step``: an expression of the script's globals that
    numbers every MetricsLogger row (``--step``). ``spared``: given, the script's own saves are skipped
    (``hookwrap trace``: its files stay as they are) and their paths added to it."""
    if len(when) > len(callbacks):
        raise ValueError(f"run: {len(when)} conditions for {len(callbacks)} callbacks: give one (or None) each")
    runner = Runner(script, list(args), list(presets), [], list(callbacks), list(train_only), list(only),
                    stop_as, state=state, when=[*when, *[None] * (len(callbacks) - len(when))], step=step)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    saved_main = sys.modules.get("__main__")
    _active.append(runner)
    path = os.path.abspath(script)
    held: HeldOff | None = None
    try:
        # As the script will see them, before anything is imported: a module woven
        # with --weave may sit beside the script.
        sys.argv[:] = [script, *args]
        sys.path.insert(0, os.path.dirname(path))
        try:
            runner.weaves = [parse_weave(spec) for spec in weaves]
            code = runner.prepare()
        except BadInput as bad:
            print(bad.message, file=sys.stderr)
            return 2
        module = runner.module = ModuleType("__main__")
        # __spec__ None, as `python script.py` has: multiprocessing's spawn then runs the
        # script again as __mp_main__ in each child, where its functions are found.
        vars(module).update(__file__=path, __spec__=None, __package__=None, __cached__=None,
                            __loader__=None)
        sys.modules["__main__"] = module
        if spared is not None:
            held = HeldOff(module, output=False)
        try:
            # The script's end settles every deferring callback (rows written, NaN
            # checks decided) before they are removed, however it ends.
            with boundary():
                try:
                    exec(code, vars(module))
                except BaseException as exc:
                    ended = exc.code in (None, 0) if isinstance(exc, SystemExit) else \
                        isinstance(exc, StopTraining) or isinstance(exc.__cause__, StopTraining)
                    runner.end_run(None if ended else exc)
                    raise
                runner.end_run(None)
        except BadInput as bad:
            print(bad.message, file=sys.stderr)
            runner._fired.clear()  # the run never got to call them: what it lacked is said above
            return 2
        except SystemExit as exc:
            return _exit_status(exc)
        except StopTraining as stop:  # a callback ended the run: the script's end, status 0
            print(f"{PROG}: stopped: {stop} (the script ended there: its code after that point did not run)",
                  file=sys.stderr)
            return 0
        except BaseException as exc:
            if runner._stop_as is not None and isinstance(exc, runner._stop_as) \
                    and isinstance(exc.__cause__, StopTraining):
                # Delivered as the script's own early exit, which it did not catch: a stop all the same.
                print(f"{PROG}: stopped: {exc.__cause__} (delivered as {runner._stop_as.__name__}, which the "
                      f"script did not catch: its code after that point did not run)", file=sys.stderr)
                return 0
            if not isinstance(exc, Exception):
                raise
            tb = _script_traceback(exc.__traceback__)
            sys.excepthook(type(exc), exc.with_traceback(tb), tb)
            return 1
        if runner.stopped:
            print(f"{PROG}: stopped: {runner.stopped[-1]} (delivered as {runner._stop_as.__name__}: the "
                  f"script's own ending ran)", file=sys.stderr)
        return 0
    finally:
        if held is not None and spared is not None:
            held.release()
            spared.update(held.saves)
        _active.remove(runner)
        if runner.module is not None:
            for line in runner.summary():
                print(line, file=sys.stderr)
        runner.undo()
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def _exit_status(exc: SystemExit) -> int:
    """As the interpreter exits for ``SystemExit(code)``: None 0, an int itself,
    anything else printed to stderr and 1."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
