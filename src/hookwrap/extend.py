"""The extension API: writing callbacks like the ones hookwrap ships.

``hookwrap.torch`` (``EarlyStopping``, ``NanGuard``, ``Checkpoint``, ...) and
``hookwrap.integrations`` are built on the public ``hookwrap`` API and on this
module alone, so anything they do, a callback of your own can do too. A plain
``hookwrap.Callback`` with methods named after events (``post_loss(self, obj,
return_value)``) needs none of it. Reach for it when a callback takes its events
and values as settings (``LossLogger(event="compute_loss")``), the way the
shipped ones do:

* **Choose the events when attached.** Override ``Callback.event_methods(target)``
  and return ``(event, callable)`` pairs. ``target`` is what the callback is
  attached to: a class (also when it is attached to one object:
  ``obj.add_callback(cb)`` passes ``type(obj)``, and the callback still runs for
  ``obj`` alone), a hookable function, a module of them, or ``None`` for the
  global tier (``hookwrap.register_global_callback(cb)``, ``with cb:``).
* **Check the names against the target** with ``join_points`` (a misspelled
  event fails when the callback is attached, with the closest names) or
  ``has_join_point`` (an optional event, skipped where it is missing).
* **Hand one value to a method** with ``reader``: the argument ``name`` of
  the join point, ``return_value``, ``exception``, or nothing. The registration
  plans it like a function asking for that argument, so a name the join point
  does not have is refused at attach time, and it returns what the callback
  contract asks (the value it took on ``pre-`` and for ``return_value``, else
  ``None``): your method's return value is ignored. A reader pickles and
  deep-copies with its callback (``torch.save`` of the hooked object).
* **Read a different value on each join point** with ``per_join_point``:
  your function gets a ``JoinPointInfo`` (the join point's arguments, whether
  it has an object) when the join point plans the callback, once, and returns the
  reader to use there.
* **Respect distributed runs** with ``process_rank`` and ``process_group`` (or set
  ``rank_zero_only = True`` on a callback that only prints or writes).
* **Keep state across a resume**: a callback with ``state_dict()`` and
  ``load_state_dict(state)`` is saved by ``hookwrap.callback_state(obj)``;
  ``stateful_callbacks`` lists those attached to an object.
* **Defer without losing anything**: mix ``Defers`` into a callback that holds
  values back (a batched read from the device, rows written in batches) and
  define ``settle(obj, ending)``; it is called at every boundary that always
  comes: the end of ``fit`` (its ``run_event``), however it ends, or of the
  outermost ``fit`` that drove it, ``callback_state``, the end of a ``hookwrap
  run`` script or a ``boundary()`` block, a notebook cell's end, SIGTERM,
  interpreter exit. ``describe()`` shows where (``settle_at_run_end``).
* **Return a handle** that undoes what you did: subclass ``Removable``
  (``remove()``, and a context manager removing on exit), as
  ``hookwrap.integrations``' presets do; ``is_join_point`` tells whether an
  attribute is already hookable (woven or decorated), and ``weave_only`` weaves a
  class's method without the overrides of its subclasses, for a preset that
  handles those its own way.
* **Refuse what would be ignored**: a ``FixedList`` subclass with a ``refusal``
  message is a list every change of which raises ``HookError`` with it (a
  class's declared ``callbacks``, read once when the class is created).

Example: a loss logger, attachable to a class of loop, one of its objects, a
hookable function or the global tier, checked when attached, saved on resume:

```python
import hookwrap as hw
from hookwrap.extend import join_points, reader


class LossLogger(hw.Callback):
    # Records what the join point `event` returns, at each call.

    def __init__(self, event="loss"):
        self.event = event
        self.losses = []

    def event_methods(self, target):
        join_points(target, self.event, where="LossLogger")  # fails here if misspelled
        return [(f"post-{self.event}", reader(self.record, "post-", "return_value"))]

    def record(self, obj, loss):  # obj: the hooked object (None for a function)
        # (A loss tensor on a GPU: float() would wait for the device at every
        # step; queue it with hookwrap.torch.readback.ReadBack, as the shipped
        # callbacks do.)
        self.losses.append(float(loss))

    def state_dict(self):
        return {"losses": list(self.losses)}

    def load_state_dict(self, state):
        self.losses = list(state["losses"])


class Loop(hw.Hookable):
    @hw.hookable
    def loss(self, x):
        return x * x


loop, logger = Loop(), LossLogger()
loop.add_callback(logger)
loop.loss(3.0)
print(logger.losses)                # [9.0]
print(hw.callback_state(loop))      # {'LossLogger': {'losses': [9.0]}}
try:
    Loop().add_callback(LossLogger(event="los"))
except hw.UnknownEventError as exc:
    print(exc)  # LossLogger: Loop has no join point 'los'. Did you mean 'loss'? ...
```

A value read where each join point has it (as ``GradNorm(model="model")`` does):
the argument ``model`` where the join point takes one, else the hooked object's
attribute, chosen once per join point; a function with neither is refused when
the callback is attached:

```python
import hookwrap as hw
from hookwrap.extend import per_join_point, reader


class ModelWatcher(hw.Callback):
    def __init__(self, event="step"):
        self.event = event
        self.seen = []

    def event_methods(self, target):
        return [(f"post-{self.event}", per_join_point(self, "see", self.choose))]

    def choose(self, jp):  # a JoinPointInfo, once per join point
        if "model" in jp.arguments:
            return reader(self.see, "post-", "model")
        if not jp.has_object:
            raise hw.CallbackSignatureError(f"ModelWatcher: {jp.where} has no argument 'model' and no object.")
        return reader(self.see_attribute, "post-")

    def see(self, obj, model):
        self.seen.append(model)

    def see_attribute(self, obj):
        self.seen.append(obj.model)


class Trainer(hw.Hookable):
    model = "the trainer's model"

    @hw.hookable
    def step(self):
        pass


@hw.hookable
def step(model):
    pass


trainer, watcher = Trainer(), ModelWatcher()
trainer.add_callback(watcher)
hw.add_callback(step, watcher)
trainer.step()
step("a model passed in")
print(watcher.seen)  # ["the trainer's model", 'a model passed in']
```

A callback that holds values back and writes them in batches, settled at the
end of the run (its ``run_event``, ``"fit"``) however it ends (here a
``StopTraining`` raised by another callback of the same event, which runs first):

```python
import hookwrap as hw
from hookwrap.extend import Defers, reader


class BatchedLog(Defers, hw.Callback):
    def __init__(self):
        self.held, self.written = [], []

    def event_methods(self, target):
        return [("post-loss", reader(self.record, "post-", "return_value"))]

    def record(self, obj, loss):
        self.held.append(loss)  # no write per step

    def settle(self, obj, ending):  # at each boundary: write what is held
        self.written += self.held
        self.held = []


class Trainer(hw.Hookable):
    @hw.hookable
    def fit(self, losses):
        for value in losses:
            self.loss(value)

    @hw.hookable
    def loss(self, value):
        return value


def stop_at_three(self, return_value):
    if return_value == 3:
        raise hw.StopTraining("enough")
    return return_value


trainer, log = Trainer(), BatchedLog()
trainer.add_callback(log)
trainer.after("loss", stop_at_three)
try:
    trainer.fit([1, 2, 3, 4])
except hw.StopTraining:
    pass
print(log.written)  # [1, 2, 3]
```

Everything here is checked when the callback is attached, never per call: a
reader costs what a function callback asking for the same argument costs.
"""

from __future__ import annotations

import functools
from keyword import iskeyword
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from ._callback import (
    Defers,
    Ending,
    boundary,
    deferring_callbacks,
    settle_all,
    signal_course,
    stateful_callbacks as _stateful_callbacks,
    track_deferring,
)
from ._entries import PHASES, normalize, process_group as _process_group, process_rank as _process_rank
from ._hookable import weave_only
from ._joinpoints import (
    all_join_points,
    find_join_point,
    join_point_of,
    per_join_point as _per_join_point,
    reader as _reader,
    spec_of,
    target_join_points,
)
from ._paths import anchored
from ._plain import check_plain, weights_only_load
from ._registry import FixedList, Removable, runs_last
from ._rules import DONE, METHOD, NOT_STARTED, STARTED, Guard
from .errors import HookError, UnknownEventError, closest, safe_repr

__all__ = [
    "anchored",
    "check_plain",
    "runs_last",
    "weights_only_load",
    "DONE",
    "NOT_STARTED",
    "STARTED",
    "Defers",
    "Ending",
    "FixedList",
    "JoinPointInfo",
    "Removable",
    "has_join_point",
    "is_join_point",
    "join_points",
    "per_join_point",
    "process_group",
    "process_rank",
    "boundary",
    "deferring_callbacks",
    "guard",
    "listened",
    "reader",
    "settle_all",
    "signal_course",
    "stateful_callbacks",
    "track_deferring",
    "weave_only",
]

# The phases a reader may be registered on: around advice must call proceed, which
# a reader cannot; a custom event (hookwrap.emit) passes keyword arguments.
_READER_PHASES = ("pre-", "post-", "error-")


@dataclass(frozen=True)
class JoinPointInfo:
    """What a callback may ask of one join point, as ``join_points`` returns it
    and as ``per_join_point`` hands it to its ``choose``. Read-only; made by
    hookwrap, not by you."""

    event: str
    """The join point's name: ``"loss"`` has the events ``pre-loss``, ``post-loss``, ..."""
    where: str
    """A label for error messages: ``"join point 'loss' (Loop.loss)"``."""
    arguments: tuple[str, ...]
    """The names of its arguments a callback may ask for, the object (``self``) left out."""
    has_object: bool
    """True for a method (a reader's handler gets the hooked object), False for a
    function or staticmethod (it gets ``None``)."""
    returns_none: bool
    """True when annotated ``-> None``: a ``return_value`` reader would read nothing."""
    function: Callable[..., Any]
    """The function behind the join point (its annotations: ``typing.get_type_hints``)."""


def _info(spec: Any) -> JoinPointInfo:
    return JoinPointInfo(event=spec.event, where=spec.where, arguments=tuple(spec.refs),
                         has_object=spec.has_obj, returns_none=spec.returns_none, function=spec.func)


def _check_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise HookError(f"{where}: a join point name must be a non-empty string like 'loss', "
                        f"got {safe_repr(name)} ({type(name).__name__}).")
    return name


def _not_an_event(name: str) -> str:
    """A hint when ``name`` is an event (``post-loss``) where a join point name is asked."""
    phase, sep, rest = name.partition("-")
    if sep and phase in PHASES and rest:
        return f" Pass the join point's name, {rest!r}, not the event {name!r}."
    return ""


def _found(target: Any, name: str, where: str) -> list[Any]:
    """The join points ``name`` reaches on ``target``, or UnknownEventError."""
    if isinstance(target, type):
        try:
            return [find_join_point(target, name, where)]
        except UnknownEventError as exc:
            hint = _not_an_event(name)
            if not hint:
                raise
            raise UnknownEventError(f"{exc}{hint}") from None
    if target is not None:
        known = target_join_points(target)
        jp = known.get(normalize(name))
        if jp is None:
            events = sorted(j.event for j in known.values())
            raise UnknownEventError(
                f"{where}: {getattr(target, '__name__', target)!r} has no join point {name!r}."
                + closest(name, events) + f" Its join points: {', '.join(events) or '(none)'}."
                + _not_an_event(name)
                + ("" if events else " Make its code hookable with @hookwrap.hookable, or with hookwrap.weave "
                   "for code you cannot edit.")
            )
        return [jp]
    found = [jp for jp in all_join_points() if normalize(jp.event) == normalize(name)]
    if not found:
        known_names = sorted({jp.event for jp in all_join_points()})
        raise UnknownEventError(
            f"{where}: no join point {name!r} exists." + closest(name, known_names) + _not_an_event(name)
            + " Define or import the hookable code before attaching globally, or attach "
            "to the object: hookwrap.add_callback(obj, cb)."
        )
    return found


def join_points(target: Any, name: str, *, where: str = "hookwrap.extend.join_points") -> list[JoinPointInfo]:
    """The join points named ``name`` that a callback attached to ``target`` reaches.

    ``target`` is what ``Callback.event_methods`` receives: a class (its join point
    ``name``, inherited ones included), an instance (its class's), a hookable
    function (itself), a module (its hookable function ``name``), or ``None``, the
    global tier (every join point of that name in the process, possibly several,
    in unrelated classes). Names compare with ``-`` and ``_`` alike.

    Returns a list of ``JoinPointInfo``, never empty: one entry unless
    ``target`` is ``None``.

    Raises ``hookwrap.UnknownEventError`` when there is none, naming ``where``
    (your callback, for the message), the closest names and the target's join
    points; ``hookwrap.HookError`` when ``name`` is not a string;
    ``hookwrap.CallbackSignatureError`` when a join point is a method without a
    ``self`` parameter.
    """
    jps = _found(target, _check_name(name, where), where)
    return [_info(spec_of(jp)) for jp in jps]


def has_join_point(target: Any, name: str) -> bool:
    """True when ``join_points`` would find ``name`` on ``target``; False
    where it would raise UnknownEventError (for an optional event: attach where it
    exists, skip it elsewhere). Raises ``hookwrap.HookError`` when ``name`` is not
    a string, or is an event (``"post-loss"``) where a join point's name belongs:
    it would never be found, and a callback would silently skip its event."""
    _check_name(name, "hookwrap.extend.has_join_point")
    hint = _not_an_event(name)
    if hint:
        raise HookError(f"hookwrap.extend.has_join_point({name!r}):{hint}")
    try:
        _found(target, name, "")
    except UnknownEventError:
        return False
    return True


def is_join_point(value: Any) -> bool:
    """True when ``value``, an attribute as stored in a class or module (``vars(cls)
    ["step"]``), is a join point: decorated with ``@hookwrap.hookable`` or woven,
    also inside a ``classmethod``/``staticmethod``. A function that merely wraps
    one (``functools.wraps``) is not. Never raises."""
    return join_point_of(value) is not None


def guard(value: Any, stopped: Callable[..., Any], *, admit: Callable[[Any], bool] | None = None,
          changed: Callable[[Any, Any, Any], None] | None = None) -> None:
    """Give join point ``value`` (as stored: ``vars(cls)["step"]``) a guard: what
    runs around its callbacks, only when they run (a call with none calls the
    function alone, at the dispatch's cost: a guard costs nothing where nobody
    listens). For presets, which stop the framework's way.

    ``stopped(obj, exc, ran, result, args, kwargs)``: a callback of the call raised
    ``StopTraining`` ``exc``; ``ran`` says how far the function got
    (``hookwrap.extend.NOT_STARTED``, ``STARTED``: interrupted midway, ``DONE``:
    ``result`` is what it returned); ``args`` and ``kwargs`` are the call's own, the
    object first. It returns what the call returns, or raises. ``admit(obj)``:
    False runs the function alone, without callbacks. ``changed(obj, original,
    result)``: the callbacks returned another value than the function did. Set it
    right after weaving; a coroutine or generator join point takes none."""
    jp = join_point_of(value)
    if jp is None:
        raise HookError(f"hookwrap.extend.guard: {safe_repr(value)} is not a join point.")
    if jp.run_wrapped is not None or jp.guard is not None:
        raise HookError(f"hookwrap.extend.guard: {jp.__qualname__} runs its callbacks inside its coroutine or "
                        f"generator, or has a guard already: it takes no guard.")
    for name, fn in (("stopped", stopped), ("admit", admit), ("changed", changed)):
        if not callable(fn) and (fn is not None or name == "stopped"):
            raise HookError(f"hookwrap.extend.guard: {name} must be callable, got {safe_repr(fn)}.")
    jp.guard = Guard(stopped, admit, changed)


def listened(value: Any) -> Callable[[Any], bool]:
    """For method join point ``value`` (as stored: ``vars(cls)["step"]``): a function
    ``listened(obj)`` that says whether a call on ``obj`` would run callbacks, as
    cheaply as the dispatch finds out. For code that reaches the join point through
    a wrapper of its own (a preset routing a framework's call to it): where nobody
    listens, it calls the method straight away."""
    jp = join_point_of(value)
    if jp is None or jp.binding != METHOD:
        raise HookError(f"hookwrap.extend.listened: {safe_repr(value)} is not a method join point.")
    return jp.listened  # type: ignore[no-any-return]


def _check_handler(handler: Any, where: str) -> None:
    owner = getattr(handler, "__self__", None)
    if not callable(handler) or owner is None or isinstance(owner, ModuleType):
        raise HookError(
            f"{where}: the handler must be a method of your callback object (self.record), got "
            f"{safe_repr(handler)}. It is called as handler(obj, *extra, value); the callback object "
            f"owns the registration (ordering, callback_state, describe)."
        )


def reader(handler: Callable[..., Any], event: str, name: str | None = None,
           extra: tuple[Any, ...] = ()) -> Callable[..., Any]:
    """A callable to return from ``event_methods``: at each call of the event it
    calls ``handler(obj, *extra, value)``, or ``handler(obj, *extra)`` without
    ``name``.

    ``handler`` is a method of your callback object (``self.record``); ``obj`` is
    the hooked object, ``None`` on a function join point. ``event`` is the event
    the reader is registered for, or just its phase: ``"pre-"``, ``"post-"`` or
    ``"error-"`` (``"post-loss"`` and ``"post-"`` do the same). ``name`` is an
    argument of the join point, ``"return_value"`` (``post-``) or ``"exception"``
    (``error-``). ``extra`` are fixed values passed first (which event, which
    setting), so one method serves several events.

    Returns a ``functools.partial`` that the registration plans like a function
    asking for ``name``, that pickles and deep-copies with its callback, and that
    returns what the callback contract asks: the value it took on ``pre-`` and for
    ``return_value``, else ``None`` (the handler's own return value is ignored).

    Raises ``hookwrap.HookError`` for a handler that is not a bound method, an
    ``around-`` or custom event, a ``name`` that is not an identifier, or
    ``extra`` that is not a tuple. A ``name`` the join point does not have is
    refused when the callback is attached (``hookwrap.CallbackSignatureError``).
    """
    where = "hookwrap.extend.reader"
    _check_handler(handler, where)
    if not isinstance(event, str) or not event.startswith(_READER_PHASES):
        raise HookError(
            f"{where}: event must be 'pre-', 'post-' or 'error-', or a whole event such as 'post-loss', "
            f"got {safe_repr(event)}. Around advice calls proceed, which a reader cannot: register a "
            f"function with hookwrap.around for it."
        )
    if name is not None and (not isinstance(name, str) or not name.isidentifier() or iskeyword(name)):
        raise HookError(f"{where}: name must be an argument name of the join point, 'return_value' or "
                        f"'exception', or None for no value; got {safe_repr(name)}.")
    if name == "self":
        raise HookError(f"{where}: name='self' asks for the hooked object, which the handler gets "
                        f"anyway, as its first argument obj; pass name=None to take no value.")
    if not isinstance(extra, tuple):
        raise HookError(f"{where}: extra must be a tuple of values passed before the event's value, got "
                        f"{type(extra).__name__}. Write extra=(value,).")
    return _reader(handler, event, name, extra)


def _choose_with_info(choose: Callable[[JoinPointInfo], Any], spec: Any) -> Any:
    # Module level, bound by functools.partial: it pickles with the callback.
    return choose(_info(spec))


def per_join_point(owner: Any, name: str, choose: Callable[[JoinPointInfo], Any]) -> Callable[..., Any]:
    """A callable to return from ``event_methods`` that is a different
    ``reader`` on each join point it is planned on.

    ``owner`` is your callback object; ``name`` names the callable in
    ``hookwrap.describe`` (``"Owner.name"``). ``choose(info)`` is called once per
    join point with its ``JoinPointInfo`` and returns the reader to run there
    (``reader(self.see, "post-", "model")`` where ``"model" in info.arguments``,
    else one reading ``obj.model``). Where the join point cannot give what the
    callback needs, ``choose`` raises ``hookwrap.CallbackSignatureError`` saying
    why: attaching to that object fails with it; on the global tier that join
    point is skipped. Keep ``choose`` picklable (a bound method, or a
    ``functools.partial`` of one) for ``torch.save`` of a hooked object.

    Returns the callable. Raises ``hookwrap.HookError`` when ``owner`` is ``None``,
    ``name`` is not a string, or ``choose`` is not callable.
    """
    where = "hookwrap.extend.per_join_point"
    if owner is None or isinstance(owner, ModuleType):
        raise HookError(f"{where}: owner must be your callback object (self), got {safe_repr(owner)}.")
    if not isinstance(name, str) or not name:
        raise HookError(f"{where}: name must be a non-empty string naming the callable in describe(), "
                        f"got {safe_repr(name)}.")
    if not callable(choose):
        raise HookError(f"{where}: choose must be a callable taking a JoinPointInfo and returning a "
                        f"reader, got {safe_repr(choose)} ({type(choose).__name__}).")
    return _per_join_point(owner, name, functools.partial(_choose_with_info, choose))


def process_group() -> Any:
    """``torch.distributed`` when its default process group is initialised, else
    None. Never imports torch. What ``process_rank`` and the decisions of
    ``hookwrap.torch.distributed`` ask before they communicate."""
    return _process_group()


def process_rank() -> int:
    """This process's rank: torch.distributed's once its process group is
    initialised, before that torchrun's ``RANK`` environment variable, else 0.
    Never imports torch. Raises ``hookwrap.HookError`` when ``RANK`` is set to
    something other than a whole number."""
    return _process_rank()[0]


def stateful_callbacks(obj: Any) -> dict[str, Any]:
    """The callbacks attached to ``obj`` (an object, a class, a hookable function)
    in any tier that have ``state_dict()`` and ``load_state_dict()``, by the key
    ``hookwrap.callback_state(obj)`` saves them under (their ``state_key``; a key
    taken already gets ``#2``, ``#3``, ... in attachment order), in chain order.

    Returns a new dict (changing it changes nothing attached): empty for an
    object with no callbacks, or no join points at all."""
    return _stateful_callbacks(obj)
