"""What every preset is built from.

``stage``: a method of the framework's class becomes a join point under a standard
event name (``hw.weave(cls, step="training_step")``), inside two plain functions:

* a *body* (innermost, in place of the original) that notes whether the original
  ran and what it returned;
* an *outer* wrapper (``functools.wraps`` of the woven join point, so registration
  still finds it) that catches ``hookwrap.StopTraining`` raised by any callback
  of the call, pre and post ones included, and asks the framework to stop its own
  way (``stop(owner, exc)``). The call then returns what the framework expects: the
  original's result when it ran, else the original run without callbacks (as the
  framework's own stop flag lets the current stage finish). A StopTraining that
  interrupted the original midway goes on to the enclosing stage.

``routed``: a method of another object the framework calls (``Accelerator.backward``
from HF's ``training_step``, a Lightning loop's ``run``) becomes a join point of the
object the callbacks attach to (the trainer, the module), named ``hookwrap_<event>``
on its class, so one ``hw.add_callback(trainer, cb)`` reaches every event and a
callback reads ``trainer.model`` and ``trainer.optimizer``.

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
import threading
import weakref
from types import FunctionType
from typing import Any, Callable

from .. import load_callback_state
from ..extend import Removable, is_join_point, stateful_callbacks, weave_only
from ..errors import HookError, StopTraining

__all__ = ["ACCUMULATES", "PresetHandle", "accumulates", "current_run", "log_event", "patch", "resume_callbacks",
           "resume_without_state", "routed", "running", "stage", "stop_while_running", "target_class"]

_STARTED, _DONE, _NOTHING = object(), object(), object()
_local = threading.local()
_running: dict[int, int] = {}  # id(owner) -> fit calls running
# The top function of each removed _Layer (which forwards to what it replaced) -> (its
# class, attribute, whether the class held what it replaced, and that): never the
# layer, which holds the top, a weak key the value would keep alive.
_removed_tops: weakref.WeakKeyDictionary[Any, tuple[type, str, bool, Any]] = weakref.WeakKeyDictionary()


def _stack(name: str) -> list[Any]:
    stack = getattr(_local, name, None)
    if stack is None:
        stack = []
        setattr(_local, name, stack)
    return stack


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
    for owner in reversed(_stack("runs")):
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


def _removed_layer(value: Any) -> tuple[type, str, bool, Any] | None:
    if type(value) is not FunctionType:  # a layer's top is a function; not every value is weakly referable
        return None
    return _removed_tops.get(value)


class _Layer:
    """One preset's change of ``cls.attr`` (a stage's or a router's): ``top``, stored over
    ``below`` (``own``: held by ``cls`` itself, else inherited).

    Code other than the class keeps calling ``top`` after the preset is removed: a
    preset woven later over the same attribute (accelerate's and transformers' both
    route ``Accelerator.backward``) calls it as its original, and an object may hold
    it (torch's LR schedulers wrap ``optimizer.step`` per instance). So a removed
    layer's top forwards each call to ``below``, and where another layer sits on it
    (``buried``), the attribute is left to that one, which restores past it."""

    __slots__ = ("attr", "below", "buried", "cls", "own", "removed", "top")

    def __init__(self, cls: type, attr: str, below: Any) -> None:
        self.cls, self.attr, self.below = cls, attr, below
        self.own = attr in vars(cls)
        self.top: Any = None
        self.removed = self.buried = False

    def put(self, handle: PresetHandle, top: Any) -> None:
        """Store ``top``, the layer's last change: its undo runs first and decides."""
        _set(handle, self.cls, self.attr, top, self)
        self.top = top
        handle._undo.append(self._remove)

    def _remove(self) -> None:
        self.removed = True
        _removed_tops[self.top] = (self.cls, self.attr, self.own, self.below)
        self.top.__wrapped__ = self.below  # what it reaches now (a scan for join points reads it)
        self.buried = vars(self.cls).get(self.attr) is not self.top


def _body(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Runs ``fn`` (or, once, what ``instead`` put for this body); notes in the outer
    wrapper's slot that it started and what it returned."""

    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> Any:
        slots = _stack("slots")
        slot = slots[-1] if slots and slots[-1][0] is body else None
        if slot is not None:
            slot[1] = _STARTED
        substitutes = getattr(_local, "instead", None)
        if substitutes and substitutes[-1][0] is body:
            result = substitutes.pop()[1]()
        else:
            result = fn(*args, **kwargs)
        if slot is not None:
            slot[1], slot[2] = _DONE, result
        return result

    return body


def instead(body: Callable[..., Any], run: Callable[[], Any]) -> list[Any]:
    """The next call of stage ``body`` in this thread runs ``run()`` in place of the
    method it wraps, its callbacks around it as ever: an update that reaches the
    framework elsewhere (Lightning's manual ``opt.step()``) fires the event without
    running the method. Returns the entry; ``done(entry)`` drops it if never used."""
    entry = [body, run]
    _stack("instead").append(entry)
    return entry


def done(entry: list[Any]) -> None:
    stack = _stack("instead")
    if stack and stack[-1] is entry:
        stack.pop()


def stage(handle: PresetHandle, cls: type, event: str, attr: str, *,
          stop: Callable[[Any, StopTraining], bool] | None = None, fit: bool = False,
          within: Callable[..., Any] | None = None,
          changed: Callable[[Any, Any, Any], None] | None = None) -> Callable[..., Any]:
    """Make ``cls.attr`` join point ``event``. ``stop(owner, exc)`` asks the framework
    to stop (False: it cannot, as outside a run; the exception propagates). ``fit``: this stage is the run.
    ``within``: fire only while that stage (as returned by ``stage``) runs in this
    thread; other calls run the original without callbacks. ``changed(owner, original,
    result)``: called when the callbacks returned another value than the original did
    (to refuse a change the framework would never see). Returns the stage's body."""
    where = f"hookwrap.integrations: {handle.description}"
    fn = _raw(cls, attr, where)
    if not isinstance(fn, FunctionType):
        raise HookError(f"{where}: {cls.__qualname__}.{attr} is a {type(fn).__name__}, not a method.")
    if is_join_point(fn):
        raise HookError(f"{where}: {cls.__qualname__}.{attr} is already a join point (woven by a preset or "
                        f"hookwrap.weave); remove that handle first, or weave once.")
    layer = _Layer(cls, attr, fn)
    body = _body(fn)
    _set(handle, cls, attr, body, layer)
    woven_handle = weave_only(cls, **{event: attr})  # a subclass's override: weave(MySubclass)
    handle._undo.append(lambda: woven_handle._remove(restore=not layer.buried))
    woven = vars(cls)[attr]

    @functools.wraps(woven)
    def outer(self: Any, *args: Any, **kwargs: Any) -> Any:
        if layer.removed:
            return fn(self, *args, **kwargs)
        slots = _stack("slots")
        if within is not None and not any(s[0] is within for s in slots):
            return fn(self, *args, **kwargs)
        slot = [body, None, None]
        slots.append(slot)
        if fit:
            runs = _stack("runs")
            runs.append(self)
            _running[id(self)] = _running.get(id(self), 0) + 1
        try:
            result = woven(self, *args, **kwargs)
            if changed is not None and slot[1] is _DONE and result is not slot[2]:
                changed(self, slot[2], result)
            return result
        except StopTraining as exc:
            if stop is None or not stop(self, exc):
                raise
            handle.stopped = exc
            if slot[1] is _DONE:
                return slot[2]
            if slot[1] is None:  # stopped before the original ran: it runs, without callbacks
                return fn(self, *args, **kwargs)
            raise  # interrupted midway: the enclosing stage ends it
        finally:
            slots.pop()
            if fit:
                runs.pop()
                _running[id(self)] -= 1
                if not _running[id(self)]:
                    del _running[id(self)]

    outer.__wrapped__ = _shim(fn, woven)
    layer.put(handle, outer)
    handle.events[event] = f"{cls.__qualname__}.{attr}"
    return body


def _shim(fn: FunctionType, woven: Any) -> FunctionType:
    """What the outer wrapper's ``__wrapped__`` is: a copy of the original (its
    ``__code__``, for code-identity checks that unwrap one level, as Lightning's
    ``is_overridden`` does) whose own ``__wrapped__`` leads on to the join point."""
    shim = FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    functools.update_wrapper(shim, fn)
    shim.__kwdefaults__ = fn.__kwdefaults__
    shim.__wrapped__ = woven  # type: ignore[attr-defined]
    return shim


def routed(handle: PresetHandle, host: type, event: str, cls: type, attr: str,
           owner_of: Callable[[Any], Any], *, returns: Callable[[Any, Any], Any] | None = None,
           **options: Any) -> Callable[..., Any]:
    """Calls of ``cls.attr`` on an object whose ``owner_of(obj)`` is a ``host`` become
    join point ``event`` of that owner (method ``hookwrap_<event>`` of ``host``, with
    the original's parameters); other calls are untouched. ``returns(owner, result)``:
    what the join point returns instead of the original's result (which the caller
    still gets). ``options`` go to ``stage``."""
    where = f"hookwrap.integrations: {handle.description}"
    original = _raw(cls, attr, where)
    name = f"hookwrap_{event}"
    if name in vars(host):
        raise HookError(f"{where}: {host.__qualname__} is already woven by a preset; remove that one first.")

    def host_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        entry = _stack("delegates")[-1]
        result = original(entry[0], *args, **kwargs)
        entry[1] = result
        return result if returns is None else returns(self, result)

    host_method.__name__ = name
    host_method.__qualname__ = f"{host.__qualname__}.{name}"
    host_method.__doc__ = f"{cls.__qualname__}.{attr}, as join point {event!r} of the {host.__qualname__}."
    host_method.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    _set(handle, host, name, host_method)
    body = stage(handle, host, event, name, **options)
    outer = vars(host)[name]

    layer = _Layer(cls, attr, original)

    @functools.wraps(original)
    def router(obj: Any, *args: Any, **kwargs: Any) -> Any:
        owner = owner_of(obj) if not layer.removed else None
        if not isinstance(owner, host):
            return original(obj, *args, **kwargs)
        entry = [obj, _NOTHING]
        delegates = _stack("delegates")
        delegates.append(entry)
        try:
            result = outer(owner, *args, **kwargs)
        finally:
            delegates.pop()
        return result if entry[1] is _NOTHING else entry[1]

    layer.put(handle, router)
    handle.events[event] = f"{cls.__qualname__}.{attr}"
    return body


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


ACCUMULATES = "__hookwrap_accumulation__"  # hookwrap.torch's GradAccumulation reads it


def accumulates(handle: PresetHandle, cls: type, optimizer_step: Callable[..., Any], how: str) -> None:
    """Say that the framework accumulates gradients itself (``how``: its setting): on
    the class (callbacks attached to it or its objects) and on the body of its
    ``optimizer_step`` join point (the global tier, ``hookwrap run``), where
    ``GradAccumulation`` reads it and refuses, naming ``how``."""
    _set(handle, cls, ACCUMULATES, how)
    setattr(optimizer_step, ACCUMULATES, how)


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
