"""What every preset is built from.

``stage``: a method of the framework's class becomes a join point under a standard
event name (``hw.weave(cls, step="training_step")``), stored in the class itself,
so a call nobody listens to costs the dispatch alone. What the preset adds is the
join point's guard (``hookwrap.extend.guard``), which runs only when callbacks
do: it catches ``hookwrap.StopTraining`` raised by any callback of the call, pre
and post ones included, and asks the framework to stop its own way (``stop(owner,
exc)``). The call then returns what the framework expects: the original's result
when it ran, else the original run without callbacks (as the framework's own stop
flag lets the current stage finish). A StopTraining that interrupted the original
midway goes on to the enclosing stage.

``routed``: a method of another object the framework calls (``Accelerator.backward``
from HF's ``training_step``, a Lightning loop's ``run``) becomes a join point of the
object the callbacks attach to (the trainer, the module), named ``hookwrap_<event>``
on its class, so one ``hw.add_callback(trainer, cb)`` reaches every event and a
callback reads ``trainer.model`` and ``trainer.optimizer``. Where no callback
would run (``hookwrap.extend.listened``), the router calls the method straight away.

The stop functions of the trainers act only while the owner's ``fit`` stage runs
(``running(owner)``): outside a run (``trainer.evaluate()`` called alone) there is
nothing to stop, so the StopTraining propagates. The ``fit`` stage itself catches
none: a StopTraining from ``fit``'s own callbacks reaches the caller of ``fit``.

Two presets may change the same method (accelerate's and transformers' both take
``Accelerator.backward``) and be removed in either order (``_Layer``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import threading
import weakref
from types import FrameType, FunctionType
from typing import Any, Callable

from .. import load_callback_state
from ..extend import DONE, NOT_STARTED, Removable, guard, is_join_point, listened, stateful_callbacks, weave_only
from ..errors import HookError, StopTraining

log = logging.getLogger(__name__)  # under "hookwrap": a preset applied, and removed, at INFO

__all__ = ["ACCUMULATES", "GRAD_NORM", "READING", "RESUMES", "SCALER", "STEP_AXIS", "PresetHandle", "Stage",
           "accumulates", "counts_updates", "current_run", "decides_as", "holds_gradients", "log_event", "patch",
           "resume_callbacks",
           "resume_from_folder", "resume_without_state", "resumes_itself", "routed", "running", "scales_loss",
           "stage", "stop_while_running", "target_class"]

_NOTHING = object()


class _Local(threading.local):
    """Per thread: the runs (``runs``), what ``instead`` put, and the object a
    routed call was made on."""

    delegate: Any = None

    def __init__(self) -> None:
        self.runs: list[Any] = []
        self.instead: list[list[Any]] = []


_local = _Local()
_running: dict[int, int] = {}  # id(owner) -> fit calls running
# The top function of each removed _Layer (which forwards to what it replaced) -> (its
# class, attribute, whether the class held what it replaced, and that): never the
# layer, which holds the top, a weak key the value would keep alive.
_removed_tops: weakref.WeakKeyDictionary[Any, tuple[type, str, bool, Any]] = weakref.WeakKeyDictionary()
_LAYER_ATTR = "__hookwrap_layer__"  # on a layer's top: the layer


def running(owner: Any) -> bool:
    """Is a ``fit`` stage of ``owner`` running (in any thread)?"""
    return id(owner) in _running


def stop_while_running(ask: Callable[[Any], None]) -> Callable[[Any, StopTraining], bool]:
    """A trainer preset's ``stop``: ``ask(owner)`` to stop the way the framework stops
    itself, while the owner's ``fit`` runs; outside a run it declines (False), and the
    StopTraining propagates."""

    def stop(owner: Any, exc: StopTraining) -> bool:
        if not running(owner):
            return False
        ask(owner)
        return True

    return stop


def current_run(cls: type) -> Any:
    """The innermost owner of class ``cls`` whose ``fit`` runs in this thread, or None."""
    runs = _local.runs
    if runs and isinstance(runs[-1], cls):  # the usual answer, without an iterator
        return runs[-1]
    for owner in reversed(runs):
        if isinstance(owner, cls):
            return owner
    return None


class PresetHandle(Removable):
    """What a preset's ``weave()`` returns: ``remove()`` (idempotent; also a context
    manager) restores every attribute it changed. ``events`` maps each event to the
    method behind it; ``stopped`` is the last StopTraining that stopped a run."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.events: dict[str, str] = {}
        self.stopped: StopTraining | None = None
        self._undo: list[Callable[[], None]] = []

    def remove(self) -> None:
        if self._undo:
            log.info("preset %s removed", self.description)
        while self._undo:
            self._undo.pop()()

    @property
    def applied(self) -> bool:
        return bool(self._undo)

    def building(self) -> Any:
        """A context: if weaving fails midway, what was done is undone."""
        return _Building(self)

    def __repr__(self) -> str:
        events = ", ".join(f"{e}={m}" for e, m in self.events.items())
        return f"<hookwrap.integrations {self.description} {'applied' if self.applied else 'removed'}: {events}>"


class _Building:
    def __init__(self, handle: PresetHandle) -> None:
        self.handle = handle

    def __enter__(self) -> PresetHandle:
        return self.handle

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.handle.remove()
        else:
            log.info("preset %s applied", self.handle.description)


def _raw(cls: type, attr: str, where: str) -> Any:
    for klass in cls.__mro__:
        if attr in vars(klass):
            return vars(klass)[attr]
    raise HookError(
        f"{where}: {cls.__qualname__} has no method {attr!r}. This preset is written for the "
        f"version pinned by hookwrap's 'thirdparty' extra; weave the method that does this stage "
        f"in your version with hookwrap.weave(cls, event='method')."
    )


def _set(handle: PresetHandle, cls: type, attr: str, value: Any, layer: _Layer | None = None) -> None:
    """Store ``value`` as ``cls.attr``; the handle's ``remove()`` puts back what was there
    (as it reads once removed layers are skipped), unless ``layer`` was removed under
    another preset's, which now owns the attribute."""
    own, saved = attr in vars(cls), vars(cls).get(attr)
    setattr(cls, attr, value)

    def undo() -> None:
        if layer is None or not layer.buried:
            _restore(cls, attr, own, saved)

    handle._undo.append(undo)


def _restore(cls: type, attr: str, own: bool, saved: Any) -> None:
    # A saved value that is the top of a layer removed since forwards to what that
    # layer replaced: put that back instead.
    while (removed := _removed_layer(saved)) is not None and removed[0] is cls and removed[1] == attr:
        own, saved = removed[2], removed[3]
    if own:
        setattr(cls, attr, saved)
    else:
        delattr(cls, attr)


def _nothing() -> None:
    return None


def _always(obj: Any) -> bool:
    return True


def _live_layer(value: Any) -> _Layer | None:
    """The layer whose top ``value`` is, if a preset stored it."""
    layer = getattr(value, "__dict__", {}).get(_LAYER_ATTR) if isinstance(value, FunctionType) or \
        is_join_point(value) else None
    return layer if isinstance(layer, _Layer) and layer.top is value else None


def _removed_layer(value: Any) -> tuple[type, str, bool, Any] | None:
    try:  # a layer's top is a function or a join point; not every value is weakly referable
        return _removed_tops.get(value)
    except TypeError:
        return None


class _Layer:
    """One preset's change of ``cls.attr`` (a stage's or a router's): ``top``, stored over
    ``below`` (``own``: held by ``cls`` itself, else inherited), which a router calls.

    Code other than the class keeps calling ``top`` after the preset is removed: a
    preset woven later over the same attribute (accelerate's and transformers' both
    route ``Accelerator.backward``) calls it as its original, and an object may hold
    it (torch's LR schedulers wrap ``optimizer.step`` per instance). So a removed
    layer's top forwards each call to ``below``, and where another layer sits on it
    (``buried``), the attribute is left to that one, which restores past it."""

    __slots__ = ("above", "attr", "below", "buried", "cls", "own", "removed", "top", "__weakref__")

    def __init__(self, cls: type, attr: str, below: Any) -> None:
        self.cls, self.attr, self.below = cls, attr, below
        self.own = attr in vars(cls)
        self.top: Any = None
        self.above: Callable[[], _Layer | None] = _nothing  # a layer stored over this one (weakly)
        self.removed = self.buried = False

    def put(self, handle: PresetHandle, top: Any) -> None:
        """Store ``top``, the layer's last change: its undo runs first and decides."""
        _set(handle, self.cls, self.attr, top, self)
        self.adopt(handle, top)

    def adopt(self, handle: PresetHandle, top: Any) -> None:
        """``top``, stored already (a join point woven in place), is the layer's last change."""
        self.top = top
        under = _live_layer(self.below)
        if under is not None:
            under.above = weakref.ref(self)
        setattr(top, _LAYER_ATTR, self)  # set last: functools.wraps copies a wrapped function's
        handle._undo.append(self._remove)

    def _remove(self) -> None:
        self.removed = True
        _removed_tops[self.top] = (self.cls, self.attr, self.own, self.below)
        self.top.__wrapped__ = self.below  # what it reaches now (a scan for join points reads it)
        self.buried = vars(self.cls).get(self.attr) is not self.top
        above = self.above()
        if above is not None and above.below is self.top:
            # The layer stored over this one (removed or not) now calls what this one
            # replaced (a removed join point's dispatch would plan chains again), and a
            # scan for join points through its wrapper finds none removed.
            above.below = self.below
            above.top.__wrapped__ = self.below


class Stage:
    """What ``stage`` returns: names the stage to ``within=``, ``instead`` and
    ``accumulates``. ``function``: what its join point calls (a copy of the method, or
    the body that can run a substitute in its place); ``code``: the method's code,
    which a frame of it runs."""

    __slots__ = ("code", "function")

    def __init__(self, code: Any) -> None:
        self.code = code
        self.function: Any = None

    def runs(self) -> bool:
        """Is a call of this stage running in this thread (a frame of its code is on
        the stack)? Asked only where a callback is to run (``within=``), so a stage
        costs nothing to note."""
        frame: FrameType | None = sys._getframe(1)
        code = self.code
        while frame is not None:
            if frame.f_code is code:
                return True
            frame = frame.f_back
        return False


def _substitutable(fn: Callable[..., Any], stage: Stage) -> Callable[..., Any]:
    """Runs ``fn``, or, once, what ``instead`` put for ``stage``."""

    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> Any:
        substitutes = _local.instead
        if substitutes and substitutes[-1][0] is stage:
            return substitutes.pop()[1]()
        return fn(*args, **kwargs)

    return body


def instead(stage: Stage, run: Callable[[], Any]) -> list[Any]:
    """The next call of ``stage`` (made ``substitutable``) in this thread runs ``run()``
    in place of the method it wraps, its callbacks around it as ever: an update that
    reaches the framework elsewhere (Lightning's manual ``opt.step()``) fires the event
    without running the method. Returns the entry; ``done(entry)`` drops it if never used."""
    entry = [stage, run]
    _local.instead.append(entry)
    return entry


def done(entry: list[Any]) -> None:
    stack = _local.instead
    if stack and stack[-1] is entry:
        stack.pop()


def stage(handle: PresetHandle, cls: type, event: str, attr: str, *,
          stop: Callable[[Any, StopTraining], bool] | None = None, fit: bool = False,
          within: Stage | None = None, changed: Callable[[Any, Any, Any], None] | None = None,
          substitutable: bool = False) -> Stage:
    """Make ``cls.attr`` join point ``event``. ``stop(owner, exc)`` asks the framework
    to stop (False: it cannot, as outside a run; the exception propagates). ``fit``:
    this stage is the run. ``within``: fire only while that stage runs in this
    thread; other calls run the original without callbacks. ``changed(owner,
    original, result)``: called when the callbacks returned another value than the
    original did (to refuse a change the framework would never see).
    ``substitutable``: ``instead`` may run something else in the method's place.

    All of that is needed only when callbacks run, so it is the join point's guard
    (``hookwrap.extend.guard``): a call with none costs the dispatch alone. Only a
    run (``fit``) keeps a wrapper of its own, which notes that its owner runs."""
    where = f"hookwrap.integrations: {handle.description}"
    fn = _raw(cls, attr, where)
    if is_join_point(fn):
        raise HookError(f"{where}: {cls.__qualname__}.{attr} is already a join point (woven by a preset or "
                        f"hookwrap.weave); remove that handle first, or weave once.")
    if not isinstance(fn, FunctionType):
        raise HookError(f"{where}: {cls.__qualname__}.{attr} is a {type(fn).__name__}, not a method.")
    this = Stage(fn.__code__)
    layer = _Layer(cls, attr, fn)
    this.function = _substitutable(fn, this) if substitutable else _copy(fn)
    _set(handle, cls, attr, this.function, layer)
    woven_handle = weave_only(cls, **{event: attr})  # a subclass's override: weave(MySubclass)
    handle._undo.append(lambda: woven_handle._remove(restore=not layer.buried))
    woven = vars(cls)[attr]
    if substitutable:  # code-identity checks that unwrap once (Lightning's is_overridden) read fn's
        woven.__wrapped__ = _copy(fn)

    function = this.function

    def stopped(obj: Any, exc: StopTraining, ran: int, result: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
        if stop is None or not stop(obj, exc):
            raise exc
        handle.stopped = exc
        if ran == DONE:
            return result
        if ran == NOT_STARTED:  # stopped before the original ran: it runs, without callbacks
            return function(*args, **kwargs)
        raise exc  # interrupted midway: the enclosing stage ends it

    # Only the calls made inside `within` fire.
    guard(woven, stopped, admit=None if within is None else lambda obj: within.runs(), changed=changed)
    if fit:
        outer = _noting(layer, fn, woven)
        outer.__wrapped__ = _copy(fn, woven)  # type: ignore[attr-defined]
        layer.put(handle, outer)
    else:
        layer.adopt(handle, woven)
    handle.events[event] = f"{cls.__qualname__}.{attr}"
    return this


def _noting(layer: _Layer, fn: Callable[..., Any], woven: Any) -> Callable[..., Any]:
    """The wrapper of a run (``fit``): notes that its owner runs (``running``,
    ``current_run``) in this thread."""

    @functools.wraps(woven)
    def outer(self: Any, *args: Any, **kwargs: Any) -> Any:
        if layer.removed:
            return fn(self, *args, **kwargs)
        runs = _local.runs
        runs.append(self)
        _running[id(self)] = _running.get(id(self), 0) + 1
        try:
            return woven(self, *args, **kwargs)
        finally:
            runs.pop()
            _running[id(self)] -= 1
            if not _running[id(self)]:
                del _running[id(self)]

    return outer


def _copy(fn: FunctionType, wrapped: Any = None) -> FunctionType:
    """A new function with ``fn``'s code, defaults and closure, whose ``__wrapped__``
    is ``wrapped`` (default ``fn``). As a join point's function: as fast as ``fn``,
    and a preset's marks (``accumulates``) never touch ``fn``. As a wrapper's
    ``__wrapped__``: ``fn``'s ``__code__`` for code-identity checks that unwrap one
    level (Lightning's ``is_overridden``), leading on to the join point."""
    copy = FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    functools.update_wrapper(copy, fn)
    copy.__kwdefaults__ = fn.__kwdefaults__
    if wrapped is not None:
        copy.__wrapped__ = wrapped  # type: ignore[attr-defined]
    return copy


def routed(handle: PresetHandle, host: type, event: str, cls: type, attr: str,
           owner_of: Callable[[Any], Any], *, returns: Callable[[Any, Any], Any] | None = None,
           also: tuple[type, ...] = (), **options: Any) -> Stage:
    """Calls of ``cls.attr`` on an object whose ``owner_of(obj)`` is a ``host`` become
    join point ``event`` of that owner (method ``hookwrap_<event>`` of ``host``, with
    the original's parameters); other calls are untouched. ``returns(owner, result)``:
    what the join point returns instead of the original's result (which the caller
    still gets). ``also``: subclasses of ``cls`` overriding ``attr`` whose calls are
    routed the same way (accelerate's ``DeepSpeedOptimizerWrapper.step``).
    ``options`` go to ``stage``."""
    where = f"hookwrap.integrations: {handle.description}"
    original = _raw(cls, attr, where)
    name = f"hookwrap_{event}"
    if name in vars(host):
        raise HookError(f"{where}: {host.__qualname__} is already woven by a preset; remove that one first.")

    def host_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        entry = _local.delegate  # [the object called, what it returned, the method]
        result = entry[2](entry[0], *args, **kwargs)
        if returns is None:
            return result
        entry[1] = result
        return returns(self, result)

    host_method.__name__ = name
    host_method.__qualname__ = f"{host.__qualname__}.{name}"
    host_method.__doc__ = f"{cls.__qualname__}.{attr}, as join point {event!r} of the {host.__qualname__}."
    host_method.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    _set(handle, host, name, host_method)
    this = stage(handle, host, event, name, **options)
    top = vars(host)[name]
    # Where no callback would run, the original is called straight away; a run
    # (fit) always goes through its wrapper, which notes that it runs.
    heard = _always if options.get("fit") else listened(top)

    for routed_class in (cls, *also):
        _route(handle, routed_class, attr, owner_of, host, top, heard, where)
    handle.events[event] = " or ".join(f"{c.__qualname__}.{attr}" for c in (cls, *also))
    return this


def _route(handle: PresetHandle, cls: type, attr: str, owner_of: Callable[[Any], Any], host: type, top: Any,
           heard: Callable[[Any], bool], where: str) -> None:
    """Store over ``cls.attr`` the router of ``routed``: a call whose owner is a
    ``host`` heard runs as join point ``top`` of that owner, ``cls``'s own method
    inside it; any other call runs that method straight away."""
    layer = _Layer(cls, attr, _raw(cls, attr, where))

    @functools.wraps(layer.below)
    def router(obj: Any, *args: Any, **kwargs: Any) -> Any:
        owner = owner_of(obj) if not layer.removed else None
        if not isinstance(owner, host) or not heard(owner):
            return layer.below(obj, *args, **kwargs)
        local = _local
        previous, entry = local.delegate, [obj, _NOTHING, layer.below]
        local.delegate = entry
        try:
            result = top(owner, *args, **kwargs)
        finally:
            local.delegate = previous
        return result if entry[1] is _NOTHING else entry[1]

    layer.put(handle, router)


def target_class(given: Any, base: type, where: str, what: str) -> type:
    """The class to weave: ``given`` (a subclass of ``base``, or an instance of one), else ``base``."""
    if given is None:
        return base
    cls = given if isinstance(given, type) else type(given)
    if not issubclass(cls, base):
        raise HookError(
            f"{where}: expected {what} ({base.__module__}.{base.__qualname__} or a subclass of it), "
            f"got {given!r}. Pass the class your code instantiates."
        )
    return cls


ACCUMULATES = "__hookwrap_accumulation__"  # hookwrap.torch reads it (_attach.FRAMEWORK_STEP): GradAccumulation, GradScaler


def accumulates(handle: PresetHandle, cls: type, optimizer_step: Stage, how: str) -> None:
    """Say that the framework accumulates gradients itself (``how``: its setting): on
    the class (callbacks attached to it or its objects) and on the body of its
    ``optimizer_step`` join point (the global tier, ``hookwrap run``), where
    ``GradAccumulation`` reads it and refuses, naming ``how``."""
    _set(handle, cls, ACCUMULATES, how)
    setattr(optimizer_step.function, ACCUMULATES, how)


STEP_AXIS = "__hookwrap_step_axis__"  # hookwrap.torch reads it (steps.STEP_AXIS): every counting callback


def counts_updates(handle: PresetHandle, cls: type, update: Stage, opens: tuple[str, ...], counter: Any,
                   said: str, event: str = "optimizer_step") -> None:
    """Say what one step is on the framework: one call of the ``update`` join point (an
    optimizer update, however many batches it accumulates), opened by the first of
    ``opens`` (the join points that begin a batch); ``counter(owner)`` the framework's
    own count of updates done, or None; ``said`` names it. On the class and on the
    update's function (the global tier), where ``hookwrap.torch.steps`` reads it."""
    axis = (event, opens, counter, said)
    _set(handle, cls, STEP_AXIS, axis)
    setattr(update.function, STEP_AXIS, axis)


SCALER = "__hookwrap_grad_scaler__"  # hookwrap.torch reads it (grad_scaler.FRAMEWORK_SCALER): GradNorm


def scales_loss(handle: PresetHandle, cls: type, scaler_of: Callable[[Any], Any]) -> None:
    """Say where the framework keeps the ``torch.amp.GradScaler`` it scales the loss
    with in float16 (``scaler_of(owner)``, None when it scales nothing): a norm of
    the gradients read before the framework unscales them is divided by its scale."""
    _set(handle, cls, SCALER, staticmethod(scaler_of))


GRAD_NORM = "__hookwrap_grad_norm__"  # hookwrap.torch reads it (_attach.FRAMEWORK_GRAD_NORM): GradNorm, GradClip


def holds_gradients(handle: PresetHandle, cls: type, norm_of: Callable[[Any], Any]) -> None:
    """Say that the framework may hold the gradients itself (DeepSpeed's ZeRO partitions
    them and steps inside ``backward``: ``p.grad`` is empty or partial):
    ``norm_of(owner)`` is a function giving the norm the framework computed for its
    latest update (what it logs as ``grad_norm``), or None where the gradients are
    the parameters' own. GradNorm reports that norm there."""
    _set(handle, cls, GRAD_NORM, staticmethod(norm_of))


READING = "__hookwrap_reading__"  # hookwrap.torch reads it (_attach.framework_reading): EarlyStopping


def decides_as(handle: PresetHandle, cls: type, **reading: Any) -> None:
    """Say how the framework's own callbacks read a setting the shipped callbacks share
    (``small_gains_set_best=True``: HF's early stopping), so that their default there
    decides as the framework does."""
    _set(handle, cls, READING, dict(reading))


RESUMES = "__hookwrap_resumes__"  # hookwrap.torch reads it (_attach.FRAMEWORK_RESUME): Checkpoint


def resumes_itself(handle: PresetHandle, cls: type, how: str) -> None:
    """Say that the framework keeps the run's position (its step and epoch counters,
    its loop) and resumes it itself (``how``: its way, which restores the callbacks'
    state too): ``Checkpoint``'s resume would put the weights back under a loop
    that starts again from step 0, so it refuses, naming ``how``."""
    _set(handle, cls, RESUMES, how)


def patch(handle: PresetHandle, cls: type, attr: str, make: Callable[[Any, _Layer], Callable[..., Any]]) -> None:
    """Replace ``cls.attr`` (no join point: a framework method the preset extends, as
    one that saves a checkpoint) by ``make(original, layer)``; the function made
    checks ``layer.removed`` (once removed, a kept reference must act as the original)."""
    original = _raw(cls, attr, f"hookwrap.integrations: {handle.description}")
    layer = _Layer(cls, attr, original)
    replacement = functools.wraps(original)(make(original, layer))
    layer.put(handle, replacement)


def _hookwrap_log(self: Any, row: dict[str, Any]) -> None:
    """A row the framework logged, its step under ``"step"`` (join point ``log``)."""


def log_event(handle: PresetHandle, cls: type, **options: Any) -> None:
    """Make ``cls.hookwrap_log(row)`` join point ``log``: the preset calls it with each
    row the framework logs (``options`` go to ``stage``)."""
    _set(handle, cls, "hookwrap_log", _hookwrap_log)
    stage(handle, cls, "log", "hookwrap_log", **options)


def save_into_folder(owner: Any, folder: Any, name: str, where: str, writes: bool) -> None:
    """A framework saved a checkpoint into ``folder``: the state of the callbacks
    attached to ``owner`` is written beside it as file ``name``, which
    ``resume_from_folder`` reads back. The state is taken on every rank (settling
    may be a collective); only a rank that ``writes`` saves it, and only plain data
    (``check_plain``), so the resume can load it without running code."""
    import os

    import torch

    from .. import callback_state
    from ..extend import check_plain

    state = callback_state(owner)
    if not state or not writes:
        return
    if not os.path.isdir(folder):
        raise HookError(f"{where}: the framework wrote no folder {folder}, where the callbacks' state goes: save "
                        f"it yourself (torch.save(hw.callback_state(...), ...)), or remove the preset.")
    check_plain(state, where, f"hw.callback_state({type(owner).__qualname__})")
    torch.save(state, os.path.join(folder, name))


def resume_from_folder(owner: Any, folder: Any, name: str) -> None:
    """A framework resumes from ``folder``: the callbacks' state the preset saved there
    as file ``name`` goes back to the callbacks attached to ``owner``, read with
    ``torch.load(weights_only=True)`` (tensors and plain data: never code from the
    folder); a folder without it is said (``resume_without_state``)."""
    import os

    from ..extend import weights_only_load

    path = os.path.join(folder, name)
    if os.path.isfile(path):
        resume_callbacks(owner, weights_only_load(path, path), path)
    else:
        resume_without_state(owner, str(folder))


def resume_without_state(owner: Any, source: str) -> None:
    """A resume from a checkpoint that carries no hookwrap state (written before the
    preset was woven, or by another tool): stateful callbacks attached start afresh,
    which is said, not done silently."""
    import warnings

    from ..errors import HookwrapWarning

    attached = sorted(stateful_callbacks(owner))
    if attached:
        warnings.warn(f"hookwrap: resuming {type(owner).__qualname__} from {source}, which holds no hookwrap "
                      f"callback state: {', '.join(map(repr, attached))} start afresh (the checkpoint was "
                      f"written without the preset woven).", HookwrapWarning, stacklevel=3)


def resume_callbacks(owner: Any, state: Any, source: str) -> None:
    """Load the ``callback_state`` a framework's checkpoint carried (``source`` names it)
    into the callbacks attached to ``owner`` now: those that match get their state; a
    saved state no callback takes, or a stateful callback with none, is warned about
    (a run resumed with other callbacks goes on), never dropped silently."""
    import warnings

    if not isinstance(state, dict):
        raise HookError(f"hookwrap.integrations: the hookwrap state in {source} is a {type(state).__name__}, "
                        f"not the dict hookwrap.callback_state() saves.")
    attached = set(stateful_callbacks(owner))
    unused, missing = sorted(set(state) - attached), sorted(attached - set(state))
    if unused or missing:
        warnings.warn(
            f"hookwrap: resuming {type(owner).__qualname__} from {source}: "
            + (f"saved state for {', '.join(map(repr, unused))}, which no attached callback takes" if unused else "")
            + ("; " if unused and missing else "")
            + (f"attached {', '.join(map(repr, missing))} had no saved state and start afresh" if missing else "")
            + ". Attach the callbacks of the saved run before resuming to resume them all.",
            stacklevel=3)
    load_callback_state(owner, state, strict=False)
