"""Attaching a shipped callback to the events of the user's own loop.

Shipped callbacks name join points (``"loss"``, ``"evaluate"``) and values
(an argument, ``return_value``, or a key of the mapping a join point returns).
Everything is resolved against the target class when the callback is attached,
so a misspelled event or a monitor the event never provides fails at once.

Written on ``hookwrap.extend`` and the public API alone (as is all of
hookwrap.torch): a callback of your own can do what these do.
"""

from __future__ import annotations

import functools
import math
import numbers
import typing
from collections.abc import Mapping
from typing import Any, Callable, ClassVar, NamedTuple

from .. import Callback
from ..errors import CallbackSignatureError, HookError, SettingError, closest
from ..extend import JoinPointInfo, has_join_point, join_points, per_join_point, process_rank, reader
from ._around import around_advice
from .steps import UpdateAxis, axis_of, update_axes

__all__ = ["COUNT", "FRAMEWORK_GRAD_NORM", "FRAMEWORK_READING", "FRAMEWORK_RESUME", "FRAMEWORK_STEP", "NUMBER_OR_NONE", "CountingCallback", "DefaultEvent", "On", "Saved",
           "ShippedCallback", "Source", "checked_device_type", "framework_reading", "framework_resume", "framework_step", "from_object", "is_rank_zero",
           "is_reference", "positive_number", "resolve_reference", "saved", "to_float",
           "whole_number"]


class DefaultEvent(str):
    """A default event name: used when the target has that join point, skipped when it
    does not. A name the user passes explicitly must exist."""

    __slots__ = ()


class Source(NamedTuple):
    """Where a value is read: an argument of the join point, its return value, or one
    key of the mapping it returns."""

    event: str  # the event read, e.g. "post-evaluate"
    name: str  # the argument name, or "return_value"
    key: str | None  # a key of the returned mapping, or None

    def pick(self, value: Any, where: str) -> Any:
        if self.key is None:
            return value
        try:
            return value[self.key]
        except (KeyError, IndexError, TypeError):
            if isinstance(value, Mapping):
                raise HookError(
                    f"{where}: {self.event} returned {', '.join(map(repr, value))}, with no {self.key!r}. "
                    f"Return it from the join point, or monitor one of those."
                ) from None
            raise HookError(
                f"{where}: {self.event} returned a {type(value).__name__}, not a mapping holding {self.key!r}: "
                f"monitor='return_value' reads the value itself."
            ) from None


class On(NamedTuple):
    """One registration a shipped callback declares (``listens = (On(...), ...)``):
    method ``handler`` runs on ``phase`` (``"pre"``, ``"post"`` or ``"around"``) of the
    event that the callback's setting ``event`` names (``"step_event"``: the attribute
    holding the join point name). ``ShippedCallback.registrations`` builds them all,
    in the order declared, with the phase-prefixed event strings.

    What ``handler`` is given, chosen once when attached (nothing is decided per call):

    * by default ``handler(obj, *extra)``, or ``handler(obj, *extra, value)`` with
      ``read`` an argument name or ``"return_value"`` (``hookwrap.extend.reader``);
    * with ``value``, the callback setting (``"model"``, ``"optimizer"``) read as
      ``value_reader`` reads it: the join point's argument of that name, else the
      hooked object's attribute, else the object passed in;
    * with ``choose``, the reader that method returns for each join point
      (``hookwrap.extend.per_join_point``);
    * on ``"around"``, ``handler(obj, proceed, *args, **kwargs)`` on methods and the
      method named ``function`` (``function(proceed, *args, **kwargs)``) on functions,
      or, with ``choose``, what it returns per join point.

    An event the target lacks is skipped when it is ``None`` or a ``DefaultEvent``
    (``wants``); with ``always`` it is registered whatever ``wants`` says (a name
    the target lacks still fails with UnknownEventError).
    """

    phase: str  # "pre", "post" or "around"
    event: str  # the setting naming the join point, e.g. "step_event"
    handler: str  # the method that runs
    read: str | None = None  # the argument read, or "return_value"
    value: str | None = None  # a setting read as value_reader reads it ("model")
    choose: str | None = None  # a method choosing the reader per join point
    function: str | None = None  # around: the method run on function join points
    extra: tuple[Any, ...] = ()  # fixed values passed to handler first
    always: bool = False  # registered even where wants() says no


def _returned_keys(jp: JoinPointInfo) -> frozenset[str] | None:
    """The keys a join point's return annotation promises: a TypedDict's keys, none
    for a type that is not a mapping, ``None`` when the annotation does not say."""
    try:
        hint = typing.get_type_hints(jp.function).get("return")
    except Exception:  # unresolvable forward references: the annotation does not say
        return None
    if hint is None or hint is Any:
        return None
    if typing.is_typeddict(hint):
        return frozenset(hint.__annotations__)
    origin = typing.get_origin(hint) or hint
    if not isinstance(origin, type) or issubclass(origin, Mapping):
        return None
    return frozenset()


class ShippedCallback(Callback):
    """Base of hookwrap.torch's callbacks: events named in the constructor, resolved
    and checked against the target when attached (``obj.add_callback(cb)``, or
    globally with ``hookwrap.register_global_callback(cb)`` / ``with cb:``)."""

    # The settings that tell two of a class apart, which name it in messages and, where
    # declared so, in the saved state: ("event",) -> GradScaler(event='step'), GradScaler[event=step].
    label: ClassVar[tuple[str, ...]] = ()
    keyed_by_label: ClassVar[bool] = False
    # The setting holding the file or folder it writes, which names it instead, and keys
    # its saved state (state_place): Checkpoint('ck'), Checkpoint[/abs/ck].
    stored_at: ClassVar[str | None] = None

    @property
    def where(self) -> str:
        if self.stored_at is not None:
            return f"{type(self).__name__}({str(getattr(self, self.stored_at))!r})"
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.label)})" \
            if self.label else type(self).__name__

    @property
    def state_key(self) -> str:
        if self.stored_at is not None:
            return f"{type(self).__name__}[{self.state_place()}]"
        if not self.keyed_by_label:
            return super().state_key
        return f"{type(self).__name__}[{','.join(f'{k}={getattr(self, k)}' for k in self.label)}]"

    def state_place(self) -> str:
        """The place in its state key: its ``stored_at`` setting, as given."""
        assert self.stored_at is not None
        return str(getattr(self, self.stored_at))

    def wants(self, target: Any, event: str | None) -> bool:
        """Should this callback attach to ``event``? ``None`` and a default the target
        lacks: no. A name the target lacks: UnknownEventError, with the closest names."""
        if event is None:
            return False
        if isinstance(event, DefaultEvent) and not has_join_point(target, event):
            return False
        join_points(target, event, where=self.where)
        return True

    def find(self, target: Any, join_point: str, monitor: str) -> Source:
        """Resolve ``monitor`` on ``join_point``: an argument of that name, else
        ``return_value``, else a key of the returned mapping (checked against the return
        annotation where it says what comes back)."""
        jps = join_points(target, join_point, where=self.where)
        event = f"post-{jps[0].event}"
        is_arg = [monitor in jp.arguments for jp in jps]
        if all(is_arg):
            return Source(event, monitor, None)
        if any(is_arg):
            raise HookError(
                f"{self.where}: {monitor!r} is an argument of some join points {join_point!r} "
                f"but not of others; attach the callback to one object with obj.add_callback(cb)."
            )
        if monitor == "return_value":
            return Source(event, "return_value", None)
        # Refused when no join point can provide it. The global tier reaches every
        # join point of that name, in classes unrelated to each other: one that can is enough.
        refusals = []
        for jp in jps:
            keys = _returned_keys(jp)
            if keys is not None and monitor not in keys:
                said = f"keys: {', '.join(sorted(keys))}" if keys else "it is not a mapping"
                refusals.append(HookError(
                    f"{self.where}: {jp.where} never provides {monitor!r}. It is not one of its "
                    f"arguments ({', '.join(jp.arguments) or 'none'}), nor a key of what its return annotation "
                    f"promises ({said})." + closest(monitor, list(jp.arguments) + sorted(keys))
                    + " Pass monitor= an argument name, 'return_value', or a key it returns."
                ))
        if len(refusals) == len(jps):
            raise refusals[0]
        return Source(event, "return_value", monitor)

    # The registrations a subclass declares, built by ``registrations`` in the order
    # given; a subclass with an ``attach`` of its own may build some of them itself.
    listens: ClassVar[tuple[On, ...]] = ()

    def event_methods(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        return self.attached(target)

    def registrations(self, target: Any, declared: tuple[On, ...],
                      events: Mapping[str, str | None] | None = None) -> list[tuple[str, Callable[..., Any]]]:
        """The ``(event, callable)`` pairs of ``declared`` on ``target``, in order: the
        event each names read from the callback's setting of that name (or from
        ``events``, a mapping of the settings, where given), skipped as ``wants``
        says unless ``always``."""
        pairs: list[tuple[str, Callable[..., Any]]] = []
        for on in declared:
            event = getattr(self, on.event) if events is None else events.get(on.event)
            if not self.wants(target, event) and not on.always:
                continue
            pairs.append((f"{on.phase}-{event}", self._advice(target, on, event)))
        return pairs

    def _advice(self, target: Any, on: On, event: Any) -> Callable[..., Any]:
        handler = getattr(self, on.handler)
        if on.choose is not None:
            return per_join_point(self, on.handler, getattr(self, on.choose))
        if on.phase == "around":
            assert on.function is not None
            return around_advice(join_points(target, event, where=self.where), self.where, handler,
                                 getattr(self, on.function))
        if on.value is not None:
            return self.value_reader(handler, f"{on.phase}-", getattr(self, on.value), on.value, on.extra)
        return reader(handler, f"{on.phase}-", on.read, on.extra)

    def attached(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        """``attach(target)``, refused when it attaches to nothing: a callback whose
        events the target lacks would never run (every one of its default events
        was skipped)."""
        pairs = self.attach(target)
        if not pairs:
            on = getattr(target, "__qualname__", getattr(target, "__name__", None)) or "the global tier"
            settings = ", ".join(f"{name}={value!r}" for name, value in sorted(vars(self).items())
                                 if name.endswith("_event") and isinstance(value, str))
            raise HookError(
                f"{self.where}: {on} has none of the join points it runs on ({settings}), so it would "
                f"never run. Name yours with those settings, or make them join points (hookwrap.weave).")
        return pairs

    def attach(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        """The callback's own ``(event, callable)`` pairs: those it declares in
        ``listens``; a subclass with more to decide builds them itself."""
        if not self.listens:
            raise NotImplementedError(f"{type(self).__qualname__} declares no listens and has no attach")
        return self.registrations(target, self.listens)

    def value_reader(self, handler: Callable[..., Any], event: str, setting: Any, what: str,
                     extra: tuple[Any, ...] = ()) -> Callable[..., Any]:
        """``handler(obj, *extra, value)`` at each call of ``event`` (``"pre-"`` or
        ``"post-"``), the value read where the join point has it: its argument named
        ``setting``, else the attribute ``setting`` of the hooked object
        (``optimizer="optimizer"`` reads ``trainer.optimizer``), else ``setting``
        itself when it is not a name (the module or optimizer passed in). Chosen once
        per join point; a function join point with neither is refused."""
        if not isinstance(setting, str):
            return reader(handler, event, None, (*extra, setting))
        if is_reference(setting):  # "__main__:model": an object the script makes, looked up at each call
            return reader(self._from_attribute, event, None, (handler.__name__, setting, what, *extra))
        choose = functools.partial(self._choose_value, handler.__name__, event, setting, what, extra)
        return per_join_point(self, handler.__name__, choose)

    def _choose_value(self, handler_name: str, event: str, setting: str, what: str,
                      extra: tuple[Any, ...], jp: JoinPointInfo) -> Any:
        handler = getattr(self, handler_name)
        if setting in jp.arguments:
            return reader(handler, event, setting, extra)
        if not jp.has_object:
            raise CallbackSignatureError(
                f"{self.where}: {jp.where} has no argument {setting!r} to read the {what} from, "
                f"and no object with such an attribute. Pass {what}= the {what} itself, the "
                f"name of the argument that carries it, or a global of the script that makes it, "
                f"{what}='__main__:{setting}' (looked up when first needed)."
            )
        return reader(self._from_attribute, event, None, (handler_name, setting, what, *extra))

    def _from_attribute(self, obj: Any, handler_name: str, setting: str, what: str, *extra: Any) -> None:
        getattr(self, handler_name)(obj, *extra, from_object(obj, setting, what, self.where))


class CountingCallback(ShippedCallback):
    """A shipped callback that counts steps (to say at which step something happened)
    and has state to resume (``state_dict``). A step is a call of ``step_event``; on a
    loop that counts optimizer updates (a framework's preset, or
    ``hookwrap.torch.counts_updates``) a default ``step_event`` is one update instead
    (``hookwrap.torch.steps``), and ``step`` is the framework's step number."""

    # Does a default step_event follow a loop's update axis? A callback that reads each
    # batch at its step event (Throughput's samples) stays on the calls of step.
    follows_updates: ClassVar[bool] = True

    def __init__(self, step_event: str | None) -> None:
        self.step_event = step_event
        self._step_setting = step_event  # as given: resolved against each target attached to
        self.step = 0  # steps started (the current step, while one runs)
        self._axis: UpdateAxis | None = None  # the update axis counted on, once attached
        self._update_open = False  # an update is in progress (between its first batch and its end)
        self._resolved = False  # attached once: the axis is known
        self._per_class = False  # the global tier: each object's class says its axis
        self._uncounted_on: str | None = None  # attached where no step event counts: said at the first row
        self._saved_axis: str | None = None  # the axis of a state loaded before attaching, to check

    def event_methods(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        setting = self._step_setting
        follows = isinstance(setting, DefaultEvent) and self.follows_updates
        axes = update_axes(target) if follows else []
        axis = axes[0] if axes else None
        if self._resolved and (axis is None) != (self._axis is None):
            raise HookError(
                f"{self.where}: attached already where a step is {'a call of step' if axis else 'an update'}, and "
                f"{getattr(target, '__qualname__', None) or 'the global tier'} counts "
                f"{'updates' if axis else 'calls of step'}: one callback numbers one axis. Attach one of its "
                f"own to each.")
        self._axis, self._per_class = axis, target is None and axis is not None
        self.step_event = setting if axis is None else DefaultEvent(axis.update)
        self._resolved = True
        if self._saved_axis is not None:
            self._check_axis(self._saved_axis, HookError)
        pairs = self.attached(target)  # its own settings checked first
        if axis is None:
            counting = self.registrations(target, _COUNTS_STEPS)
            self._uncounted_on = None if counting else (
                getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or "the global tier")
            pairs[:0] = counting
            return pairs
        # Counters first: every other handler of the call sees the update's number. Where
        # the framework keeps the count, a batch's start reads it: the update itself is
        # not listened to (a routed optimizer step nobody listens to costs nothing).
        windows = [found for found in axes if found.counter is None or self._per_class]
        events = dict.fromkeys(event for found in axes
                               for event in (*found.opens, *((found.update,) if found in windows else ())))
        counting = [(f"pre-{event}", reader(self._open_update, "pre-")) for event in events
                    if has_join_point(target, event)]
        counting += [(f"post-{event}", reader(self._close_update, "post-"))
                     for event in dict.fromkeys(found.update for found in windows)]
        if self._per_class and isinstance(setting, str) and has_join_point(None, setting):
            # The global tier reaches loops of every kind: those whose class counts no
            # updates count their calls of step, as without a preset.
            counting.append((f"pre-{setting}", reader(self._count_call, "pre-")))
        if windows and has_join_point(target, "fit"):  # a run that raised mid-update left it open
            counting.append(("pre-fit", reader(self._start_run, "pre-")))
        pairs[:0] = counting
        return pairs

    def row_step(self) -> int:
        """The step a row this callback logs now is numbered with: ``step``, said once
        when no step event counts it (every row would be step 0)."""
        if self._uncounted_on is not None and self.step == 0:
            import warnings

            from ..errors import HookwrapWarning

            where, self._uncounted_on = self._uncounted_on, None
            warnings.warn(
                f"{self.where}: {where} has no join point {self._step_setting!r}, so nothing counts steps and "
                f"every row this callback logs is numbered step 0. Pass step_event= the join point called once "
                f"a step (or, on a loop that accumulates gradients, declare its update: "
                f"hookwrap.torch.counts_updates(cls, 'optimizer_step')).", HookwrapWarning, stacklevel=3)
        return self.step

    def _open_update(self, obj: Any) -> None:
        """A batch (or an update) begins: where it is the first of an update, the
        update's step starts. Where the framework keeps the count of updates done, the
        count says so (a resumed run numbers on from it); else the update is open until
        its end (``_close_update``)."""
        axis = axis_of(obj) if self._per_class else self._axis
        if axis is None:  # the global tier, on a loop whose class counts calls (_count_call)
            return
        if axis.counter is not None:
            done = axis.counter(obj)
            if isinstance(done, int) and not isinstance(done, bool) and done >= 0:
                if done + 1 != self.step:  # the framework has counted the last update: a new one
                    self.step = done
                    self._count_step(obj)
                return
        if self._update_open:
            return
        self._update_open = True
        self._count_step(obj)

    def _close_update(self, obj: Any) -> None:
        self._update_open = False

    def _count_call(self, obj: Any) -> None:
        if axis_of(obj) is None:
            self._count_step(obj)

    def _start_run(self, obj: Any) -> None:
        self._update_open = False  # an update a raising run left open ended with it

    def _count_step(self, obj: Any) -> None:
        self.step += 1

    def state_dict(self) -> dict[str, Any]:
        if self._axis is not None:  # a state counted in updates says so: a loop counting calls refuses it
            return {"step": self.step, "step_axis": "updates"}
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        step = saved(state, "step", COUNT, self.where)
        axis = state.get("step_axis", "calls")  # states saved before step_axis existed counted calls
        if axis not in ("updates", "calls"):
            raise TypeError(f"{self.where}: the saved 'step_axis' must be 'updates' or absent, got {axis!r}")
        if self._resolved:
            self._check_axis(axis, TypeError)
        else:  # checked when attached, where the axis is known
            self._saved_axis = axis
        self.step = step

    def _check_axis(self, axis: str, error: type[Exception]) -> None:
        """Refuse a state counted on another axis than this callback counts on: its step
        numbers (every_n_steps, best steps, file names) would name other steps."""
        self._saved_axis = None
        ours = "calls" if self._axis is None else "updates"
        if axis == "calls" and ours == "updates" and self._axis is not None and self._axis.counter is not None:
            import warnings

            from ..errors import HookwrapWarning

            # Saved by a hookwrap that counted batches on a framework: the step follows the
            # framework's own counter from its next update; the steps it recorded stay as saved.
            warnings.warn(
                f"{self.where}: the saved state counts its steps in calls of {self._step_setting!r} (batches: "
                f"saved by an earlier hookwrap); loaded, and from the next update its step is the framework's "
                f"({self._axis.said}). Steps it recorded before (a best step, file names) stay in batches.",
                HookwrapWarning, stacklevel=4)
            return
        if axis != ours:
            said = {"updates": "optimizer updates", "calls": f"calls of {self._step_setting!r} (batches)"}
            raise error(
                f"{self.where}: the saved state counts its steps in {said[axis]}, and this callback, attached "
                f"here, counts {said[ours]}: its step numbers would name other steps. Resume it on the loop "
                f"it was saved on, or start it afresh.")


_COUNTS_STEPS = (On("pre", "step_event", "_count_step"),)


class Saved(NamedTuple):
    """What a value of a saved state must be: ``check(value)``, said as ``what``,
    kept as ``convert(value)``."""

    check: Callable[[Any], bool]
    what: str
    convert: Callable[[Any], Any] = lambda value: value


def _is_count(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)


COUNT = Saved(_is_count, "a whole number >= 0", int)
NUMBER_OR_NONE = Saved(lambda value: value is None or _is_number(value), "a number or None",
                       lambda value: None if value is None else float(value))


def saved(state: Mapping[str, Any], key: str, kind: Saved, where: str) -> Any:
    """``state[key]`` when it is what ``kind`` says (converted), else a TypeError
    naming the callback, the key and what it must be; a KeyError when it is missing.
    ``load_callback_state`` catches both and loads nothing. A ``load_state_dict``
    reads every value through this before it sets any: a bad state leaves the
    callback as it was (a counter loaded as the string "3" would fail steps later,
    at ``+= 1``, or compare wrongly for good)."""
    value = state[key]
    if not kind.check(value):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise TypeError(f"{where}: the saved {key!r} must be {kind.what}, got {shown} ({type(value).__name__})")
    return kind.convert(value)


def whole_number(value: Any, name: str, where: str) -> int:
    """``value`` when it is an int >= 1 (not a bool), else a HookError naming the setting."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SettingError(f"{where}: {name} must be a whole number >= 1, got {value!r}.")
    return value


def positive_number(value: Any, name: str, where: str, allow_inf: bool = False, why: str = "") -> float:
    """``value`` as a float when it is a real number > 0 (finite unless
    ``allow_inf``), else a HookError naming the setting (``why``: what it is)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if not ok or math.isnan(value) or (not allow_inf and math.isinf(value)):
        raise SettingError(f"{where}: {name} must be a number > 0{'' if allow_inf else ' and finite'}"
                           f"{f' ({why})' if why else ''}, got {value!r}.")
    return float(value)


def loss_reader(where: str, jp: JoinPointInfo, argument: str, handler: Callable[..., Any],
                fix: str, extra: tuple[Any, ...] = ()) -> Callable[..., Any]:
    """The loss a callback watches on one join point, read after it: its argument
    ``argument`` (accelerate's ``backward(loss)``) where it has one, else what it
    returns; a join point with neither (``-> None``) is refused with ``fix``."""
    if argument in jp.arguments:
        return reader(handler, "post-", argument, extra)
    if jp.returns_none:
        raise CallbackSignatureError(f"{where}: {jp.where} returns None and has no argument {argument!r}, so "
                                     f"there is no loss to read. {fix}")
    return reader(handler, "post-", "return_value", extra)


def event_names(events: Any, where: str) -> tuple[str, ...]:
    """``events`` as a tuple of join point names (one name alone is one), else a
    HookError naming the setting."""
    if isinstance(events, str):
        events = (events,)
    if not isinstance(events, (tuple, list)) or not events \
            or not all(isinstance(e, str) and e for e in events):
        raise SettingError(f"{where}: events must be a join point name or a non-empty tuple of them, "
                           f"got {events!r}.")
    return tuple(events)


def to_float(value: Any) -> float:
    """A Python float from a number or a one-element tensor (a device sync on CUDA)."""
    item = getattr(value, "item", None)
    return float(item() if item is not None else value)


def is_rank_zero() -> bool:
    """True unless this process is a torch.distributed rank other than 0."""
    return process_rank() == 0


def checked_device_type(value: Any, supported: Callable[[str], bool], where: str, setting: str, what: str,
                        without_cuda: str) -> None:
    """``setting`` of ``where`` is a device type ``supported`` takes (``what`` says
    which), and 'cuda' only where CUDA is (``without_cuda``: what would happen)."""
    import torch

    if not isinstance(value, str) or not supported(value):
        raise SettingError(f"{where}: {setting} must be a device type {what}, got {value!r}.")
    if value == "cuda" and not torch.cuda.is_available():
        raise HookError(f"{where}: {setting}='cuda', but CUDA is not available here ({without_cuda}).")


def is_reference(value: Any) -> bool:
    """Is ``value`` a ``"MODULE:NAME"`` string (``"__main__:model"``)?"""
    return isinstance(value, str) and ":" in value


def resolve_reference(value: str, what: str, where: str) -> Any:
    """The object ``"MODULE:NAME[.ATTR]"`` names now: ``__main__`` is the running script
    (under ``hookwrap run`` too), so a callback made before the script runs can name
    what the script makes (``BestCheckpoint(..., model="__main__:model")``)."""
    import importlib
    import sys

    module_name, _, path = value.partition(":")
    try:
        found: Any = sys.modules[module_name] if module_name in sys.modules else importlib.import_module(module_name)
    except ImportError as exc:
        raise HookError(f"{where}: {what}={value!r}: cannot import {module_name!r} ({exc}).") from None
    for part in path.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise HookError(
                f"{where}: {what}={value!r}: {module_name} has no {path!r} (yet): the {what} is looked up "
                f"when it is first needed, so the script must have made it by then. Name a global the "
                f"script binds before its training starts.") from None
    return found


def from_object(obj: Any, value: Any, what: str, where: str) -> Any:
    """``value`` itself, or when it is a string, that attribute of the hooked object
    (``model="model"`` reads ``trainer.model``), or the object a ``"MODULE:NAME"``
    string names (``"__main__:model"``: the script's); the hooked object itself when
    it has no such attribute and is the thing asked for (``LRMonitor`` attached to
    the optimizer, whose ``step`` is the event), or for ``"optimizer"`` the one
    optimizer its ``optimizers()`` gives (a LightningModule's)."""
    if not isinstance(value, str):
        return value
    if is_reference(value):
        return resolve_reference(value, what, where)
    if obj is None:
        raise HookError(
            f"{where}: the join point is a function, with no object to read the {what} from "
            f"as attribute {value!r}. Pass {what}= the {what} itself, or a global of the script "
            f"that makes it, {what}='__main__:{value}' (looked up when first needed)."
        )
    try:
        return getattr(obj, value)
    except AttributeError:
        if value == what and _is_a(obj, what):  # the default name only: "ema" is never the model itself
            return obj
        if what == "optimizer" and value == "optimizer" and callable(getattr(obj, "optimizers", None)):
            found = obj.optimizers()  # a LightningModule's, while it trains: one, or a list
            if not isinstance(found, (list, tuple)):
                return found
        raise HookError(
            f"{where}: {type(obj).__name__} has no attribute {value!r} to read the {what} "
            f"from. Pass {what}= the name of the attribute that holds it, or the {what} itself."
        ) from None


def _is_a(obj: Any, what: str) -> bool:
    """Is ``obj`` itself an optimizer (it has ``param_groups``) or a model (``parameters()``)?"""
    if what == "optimizer":
        return isinstance(getattr(obj, "param_groups", None), list)
    if what == "model":
        return callable(getattr(obj, "parameters", None)) and callable(getattr(obj, "state_dict", None))
    return False


# What a preset sets on the framework's class it weaves when the framework keeps the
# run's position (its loop, its step and epoch counters) and resumes it itself
# (hookwrap.integrations._weaving writes the same name): how to resume there.
FRAMEWORK_RESUME = "__hookwrap_resumes__"


def framework_resume(target: Any) -> str | None:
    """The framework's own way to resume where ``target`` (a class, or one of its
    objects) is a framework's woven trainer that keeps the run's position; None on a
    loop of the user's own. ``Checkpoint`` restores weights and counters, not a
    framework's loop, so its resume refuses such a trainer with it."""
    if target is None:
        return None
    found = getattr(target if isinstance(target, type) else type(target), FRAMEWORK_RESUME, None)
    return found if isinstance(found, str) else None


# What a preset sets on the framework's class it weaves when the framework's own callbacks
# read a setting the shipped ones share otherwise than their default does
# (hookwrap.integrations._weaving.decides_as writes the same name): a dict of settings.
FRAMEWORK_READING = "__hookwrap_reading__"


def framework_reading(target: Any, setting: str, default: Any) -> Any:
    """How the framework ``target`` (a class, one of its objects; ``None``, the global
    tier: ``default``) reads ``setting``, where its preset says; else ``default``."""
    if target is None:
        return default
    reading = getattr(target if isinstance(target, type) else type(target), FRAMEWORK_READING, None)
    return reading.get(setting, default) if isinstance(reading, dict) else default


# What a preset sets on the framework's class it weaves and on its optimizer_step join
# point's function (hookwrap.integrations._weaving writes the same name): the
# framework runs its own optimizer step, and how to accumulate gradients there.
FRAMEWORK_STEP = "__hookwrap_accumulation__"


# What a preset sets on the framework's class when the framework may hold the gradients
# itself (hookwrap.integrations._weaving.holds_gradients writes the same name): a
# function of the hooked object giving a function of its latest update's norm, or None.
FRAMEWORK_GRAD_NORM = "__hookwrap_grad_norm__"


def framework_grad_norm(obj: Any) -> Any:
    """Where the framework of hooked object ``obj`` holds the gradients (DeepSpeed), a
    function giving the norm it computed for its latest update; else None (one class
    attribute lookup: a plain loop's is Hookable's None, found at once)."""
    find = getattr(type(obj), FRAMEWORK_GRAD_NORM, None)
    return None if find is None else find(obj)


def framework_step(target: Any, event: str, where: str) -> str | None:
    """The framework's own setting where ``target`` (or, for the global tier, a join
    point ``event`` names) is a framework's woven loop that runs its optimizer step
    itself; None on a loop of the user's own. The callbacks that would change that
    step (GradAccumulation, GradScaler) refuse such a loop with it."""
    own: str | None = getattr(target, FRAMEWORK_STEP, None)
    for jp in join_points(target, event, where=where) if own is None else ():
        own = own or getattr(jp.function, FRAMEWORK_STEP, None)  # the global tier: hookwrap run
    return own

