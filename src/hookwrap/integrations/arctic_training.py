"""ArcticTraining's callback API, running on hookwrap's dispatch: change one import.

::

    # from arctic_training.callback.mixin import CallbackMixin, callback_wrapper
    from hookwrap.integrations.arctic_training import CallbackMixin, callback_wrapper

Classes, callbacks and calls keep ArcticTraining's (0.8) semantics, not
``hw.Hookable``'s:

* ``@callback_wrapper("name")`` makes a method a join point named ``name``; an
  override of it in a subclass is one too (ArcticTraining re-wraps it), an
  abstract method's included.
* A class's ``callbacks = [("pre-name", fn), ("post-name", fn)]`` adds to what
  its bases declared (an entry already there is not added twice), then its own
  ``pre_<name>_callback`` / ``post_<name>_callback`` methods, by name.
* A ``pre-`` callback is ``fn(self, <any of the method's parameters>)`` and
  returns them (one: the value; several: a sequence, in its own parameter
  order; none: nothing); whatever it returns, ``None`` included, is what the
  method gets, and from then on the method gets all its arguments by keyword
  (parameters named ``args`` or ``kwargs`` are dropped, as ArcticTraining does).
* A ``post-`` callback is ``fn(self, value)`` (the return value, whatever the
  parameter is named) and its return replaces the value, ``None`` included; on a
  method annotated ``-> None`` it is ``fn(self)``.
* Callbacks are checked when the class is first instantiated, and a bad one
  raises ``ArcticCallbackError``, a ``ValueError`` as ArcticTraining's are.
* ``CallbackMixin.callbacks`` holds ArcticTraining's three init log callbacks
  ("Initializing X", "Initialized X", "Callback methods for X", at INFO, here on
  ``logging.getLogger("hookwrap.integrations.arctic_training")``): a class that
  declares its own list without them has none, as there.
* What ArcticTraining's own code reads is there: ``_get_all_callback_event_methods()``
  and ``_initialized_callbacks``, the class's list its Ray launcher extends with
  ``Callback`` objects (they run on the class's objects until it is instantiated
  again, which rebuilds the list, as there).

Each callback is a class-tier ``around`` registration of hookwrap, so
``hw.describe`` lists them and hookwrap's own callbacks (``hw.before(obj, ...)``,
``hookwrap.torch``'s) run on the same join points. Where this differs from
ArcticTraining, and why, is in the integrations guide ("ArcticTraining").
"""

from __future__ import annotations

import inspect
import logging
import re
import threading
import weakref
from types import FunctionType
from typing import Any, Callable, TypeVar

from .. import around, hookable
from ..errors import CallbackReturnError, HookError, closest, safe_repr
from ..extend import FixedList, has_join_point, is_join_point

__all__ = ["ArcticCallbackError", "CallbackMixin", "WRAPPER_NAME_ATTR", "callback_wrapper",
           "post_init_callback_ordering_cb", "post_init_log_cb", "pre_init_log_cb"]

F = TypeVar("F", bound=Callable[..., Any])

# ArcticTraining marks its wrapped methods with this attribute; code that reads it
# (its callback-ordering log) finds it on ours too.
WRAPPER_NAME_ATTR = "__at_wrapped_name__"

# ArcticTraining's pattern, matched at the start of the name only (as its re.match):
# `pre_step_callback_2` is a `pre-step` callback there, so it is here.
_CALLBACK_METHOD = re.compile(r"(pre|post)_(.+)_callback")

_lock = threading.RLock()

# ArcticTraining logs with loguru (arctic_training.logging); the drop-in's lines go
# to the standard logging module, under "hookwrap" as hookwrap's own records.
logger = logging.getLogger(__name__)


class ArcticCallbackError(HookError, ValueError):
    """A callback of a ``CallbackMixin`` class that ArcticTraining would refuse: a
    ``ValueError`` there, so ``except ValueError`` keeps catching it."""


def callback_wrapper(name: str) -> Callable[[F], F]:
    """Make a method a join point named ``name`` (events ``pre-<name>`` and
    ``post-<name>``), as ArcticTraining's ``callback_wrapper``. An already wrapped
    method is returned as it is."""
    if not isinstance(name, str) or not name.replace("-", "_").isidentifier():
        raise HookError(f"callback_wrapper({safe_repr(name)}): the name must be a non-empty string like "
                        f"'step' or 'multi-args' (its events are 'pre-<name>' and 'post-<name>').")

    def decorator(method: F) -> F:
        if hasattr(method, WRAPPER_NAME_ATTR):
            return method
        if not isinstance(method, FunctionType):
            raise HookError(f"callback_wrapper({name!r}) decorates a method `def {name}(self, ...)`, "
                            f"got {safe_repr(method)}.")
        join_point = hookable(name)(method)
        setattr(join_point, WRAPPER_NAME_ATTR, name)
        return join_point  # type: ignore[return-value]

    return decorator


def _wrapped_name(value: Any) -> str | None:
    name = getattr(value, WRAPPER_NAME_ATTR, None) if is_join_point(value) else None
    return name if isinstance(name, str) else None


class _Frozen(FixedList):
    """A class's ``callbacks`` once the class exists. ArcticTraining reads it when the
    class is created, so an entry appended later reaches none of its objects (there,
    silently); here that is refused with the ways that do work."""

    refusal = ("a CallbackMixin class's `callbacks` list is read when the class is created: an entry "
               "added later would reach none of its objects (ArcticTraining ignores it silently). "
               "Declare it in the class body (`callbacks = [(\"pre-step\", fn)]`, or in a subclass), or "
               "register with hookwrap: hw.before(obj_or_cls, 'step', fn) / hw.after(...).")


class _Entry:
    """One ArcticTraining callback: its event, its function and where it was declared."""

    def __init__(self, event: str, fn: Callable[..., Any], origin: str) -> None:
        self.event, self.fn, self.origin = event, fn, origin
        self.phase, _, self.name = event.partition("-")
        self.label = getattr(fn, "__qualname__", None) or safe_repr(fn)
        self.plans: weakref.WeakKeyDictionary[type, Any] = weakref.WeakKeyDictionary()
        self._last: tuple[Callable[[], Any], Any] = (lambda: None, None)  # (weakref to a class, its plan)
        self.advice = self._advice()

    def __repr__(self) -> str:  # ArcticTraining's Callback repr (its ordering log prints it)
        return f"<Callback event={self.event} fn={getattr(self.fn, '__name__', self.label)}>"

    # -- checking, once per class: ArcticTraining's rules ------------------------

    def plan(self, cls: type) -> Any:
        """What a call on an object of ``cls`` needs; checks the callback the way
        ArcticTraining does, against ``cls``'s (most derived) method."""
        last, plan = self._last
        if last() is cls:  # the class of the last call: most calls
            return plan
        plan = self.plans.get(cls)
        if plan is None:
            plan = self._check(cls)
            self.plans[cls] = plan
        self._last = (weakref.ref(cls), plan)
        return plan

    def _fail(self, cls: type, problem: str) -> ArcticCallbackError:
        return ArcticCallbackError(f"{cls.__qualname__}: callback {self.label} for {self.event!r} "
                                   f"(from {self.origin}) {problem}")

    def _check(self, cls: type) -> Any:
        method = _method(cls, self.name)
        method_sig = inspect.signature(method)
        try:
            params = list(inspect.signature(self.fn).parameters.values())
        except (TypeError, ValueError) as e:
            raise self._fail(cls, f"has no signature to read ({e}); pass a Python function.") from None
        if self.phase == "pre":
            names = list(method_sig.parameters)
            for p in params:
                if p.default is not p.empty:
                    raise self._fail(cls, f"gives parameter {p.name!r} a default; callbacks take no "
                                          f"defaults (ArcticTraining refuses them too): remove it.")
                if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    raise self._fail(cls, f"takes *{p.name}; name the method's parameters it needs "
                                          f"instead, from {names}.")
                if p.name not in names and p is params[0]:
                    raise self._fail(cls, f"names its first parameter {p.name!r}: it receives the object; "
                                          f"name it `self` (ArcticTraining checks every parameter's name "
                                          f"against {self.name}{method_sig}).")
                if p.name not in names:
                    raise self._fail(cls, f"takes {p.name!r}, which {self.name}{method_sig} does not have."
                                     + closest(p.name, names) + f" It may take any of {names}.")
            if not params:
                raise self._fail(cls, "takes no parameter; a callback takes the object first: "
                                      "`def fn(self, ...)`.")
            return _binder(method_sig), tuple(p.name for p in params[1:])
        annotation = method_sig.return_annotation
        if annotation is method_sig.empty:
            return True  # ArcticTraining checks nothing then, and passes the value
        if annotation is None:
            if len(params) != 1:
                raise self._fail(cls, f"takes {len(params)} parameters; {self.name}() returns None "
                                      f"(`-> None`), so a post callback takes only `self`.")
            return False
        if len(params) != 2:
            raise self._fail(cls, f"takes {len(params)} parameters; a post callback takes two: `self` "
                                  f"and the value {self.name}() returns (any name), and returns it.")
        return True

    # -- running, as hookwrap around advice --------------------------------------

    def _advice(self) -> Callable[..., Any]:
        entry, fn = self, self.fn
        if self.phase == "pre":
            def advice(self: Any, proceed: Any, *args: Any, **kwargs: Any) -> Any:
                bind, names = entry.plan(type(self))
                # ArcticTraining passes the method every argument by keyword from here
                # on, without `self`, `args` and `kwargs`.
                call = bind(self, args, kwargs)
                returned = fn(self, **{n: call[n] for n in names}) if len(names) != 1 else \
                    fn(self, **{names[0]: call[names[0]]})
                if not names:
                    if returned is not None:
                        raise entry._fail(type(self), f"takes no argument of {entry.name}() but returned "
                                                      f"{safe_repr(returned)}; return nothing.")
                elif len(names) == 1:
                    call[names[0]] = returned
                else:
                    try:
                        count = len(returned)
                    except TypeError:
                        raise CallbackReturnError(
                            f"callback {entry.label} for {entry.event!r} takes {list(names)}, so it returns "
                            f"them, in that order: `return {', '.join(names)}`; it returned "
                            f"{safe_repr(returned)}.") from None
                    if count != len(names):
                        raise entry._fail(type(self), f"returned {count} values for {len(names)} arguments "
                                                      f"{list(names)}; return them in that order.")
                    call.update(zip(names, returned))
                return proceed(**call)
        else:
            def advice(self: Any, proceed: Any, *args: Any, **kwargs: Any) -> Any:
                value = proceed(*args, **kwargs)
                return fn(self, value) if entry.plan(type(self)) else fn(self)
        advice.__name__ = getattr(fn, "__name__", "callback")
        advice.__qualname__ = entry.label
        return advice


def _binder(signature: inspect.Signature) -> Callable[[Any, tuple[Any, ...], dict[str, Any]], dict[str, Any]]:
    """The arguments of a call of the method of ``signature`` by name, defaults filled in,
    without ``self``, ``args`` and ``kwargs``: what ``signature.bind`` and
    ``apply_defaults`` give, then ArcticTraining's filter. For the usual method (named
    parameters only) a few dict operations a call; anything else, and any call that
    does not fit (which ``bind`` then refuses with Python's own TypeError), goes
    through ``signature.bind``."""
    def slow(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = signature.bind(obj, *args, **kwargs)
        bound.apply_defaults()
        return {k: v for k, v in bound.arguments.items() if k not in ("self", "args", "kwargs")}

    params = list(signature.parameters.values())[1:]  # after the object's
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(p.kind not in plain or p.name in ("self", "args", "kwargs") for p in params):
        return slow
    positional = tuple(p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = frozenset(p.name for p in params)
    defaults = tuple((p.name, p.default) for p in params if p.default is not p.empty)

    count, most = len(params), len(positional)

    def fast(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if len(args) > most:
            return slow(obj, args, kwargs)
        call = dict(zip(positional, args))
        if kwargs:
            if not (kwargs.keys() <= names and call.keys().isdisjoint(kwargs)):
                return slow(obj, args, kwargs)
            call.update(kwargs)
        if len(call) != count:
            for name, default in defaults:
                if name not in call:
                    call[name] = default
            if len(call) != count:  # a required argument missing: bind says which
                return slow(obj, args, kwargs)
        return call

    return fast


class _Record:
    """What this module keeps per ``CallbackMixin`` class."""

    def __init__(self) -> None:
        self.declared: list[tuple[Any, Any]] = []  # ArcticTraining's _class_callbacks (list part)
        self.registered: list[_Entry] = []         # on this class (a base's pending ones included)
        self.pending: list[_Entry] = []            # events this class lacks (a subclass may add them)
        self.resolved: set[_Entry] = set()         # a base's pending ones, registered here or in a base
        self.checked = False


_records: weakref.WeakKeyDictionary[type, _Record] = weakref.WeakKeyDictionary()


def _method(cls: type, name: str) -> Any:
    """``cls``'s most derived method wrapped as join point ``name``."""
    want = name.replace("-", "_")
    for attr in dir(cls):
        value = inspect.getattr_static(cls, attr, None)
        wrapped = _wrapped_name(value)
        if wrapped is not None and wrapped.replace("-", "_") == want:
            return getattr(cls, attr)
    raise AssertionError(f"{cls.__qualname__} has no join point {name!r}")


def _parse(item: Any, where: str) -> tuple[str, Callable[..., Any]]:
    if not (isinstance(item, tuple) and len(item) == 2):
        raise ArcticCallbackError(f"{where}: each entry is an (event, callback) pair like "
                                  f"('pre-step', fn), got {safe_repr(item)}.")
    event, fn = item
    if not isinstance(event, str) or event.partition("-")[0] not in ("pre", "post") or not event.partition("-")[2]:
        raise ArcticCallbackError(f"{where}: {safe_repr(event)} is not an ArcticTraining event: name one "
                                  f"'pre-<method>' or 'post-<method>' (for around advice or error callbacks, "
                                  f"use hw.around / hw.on_error).")
    if not callable(fn):
        raise ArcticCallbackError(f"{where}: the callback for {event!r} is {safe_repr(fn)}, which is not "
                                  f"callable; pass a function `def fn(self, ...)`.")
    return event, fn


def _rewrap(cls: type) -> None:
    """ArcticTraining re-wraps a subclass's override of a wrapped method (an abstract
    one included), so its callbacks keep running whoever overrides it."""
    for attr, value in list(vars(cls).items()):
        if not isinstance(value, FunctionType) or hasattr(value, WRAPPER_NAME_ATTR):
            continue
        # What it overrides: the nearest base defining the name (an unwrapped
        # override there ends the chain, as ArcticTraining reads the resolved one).
        base = next((b for b in cls.__mro__[1:] if attr in vars(b)), None)
        name = _wrapped_name(vars(base)[attr]) if base is not None else None
        if name is not None:
            setattr(cls, attr, callback_wrapper(name)(value))


def _register(cls: type, entry: _Entry) -> bool:
    if not has_join_point(cls, entry.name):
        return False
    # Post callbacks run in declaration order after the method: as around advice they
    # are outermost-last, which `prepend` (latest first) gives across the class tier.
    around(cls, entry.name, entry.advice, prepend=entry.phase == "post")
    return True


def _prepare(cls: type) -> None:
    record = _Record()
    bases = [_records[b] for b in cls.__mro__[1:] if b in _records]
    for base in bases:
        record.declared += [d for d in base.declared if d not in record.declared]
    declared = getattr(cls, "callbacks", [])
    where = f"{cls.__qualname__}.callbacks"
    if not isinstance(declared, (list, tuple)):
        raise ArcticCallbackError(f"{where} must be a list of (event, callback) pairs, got "
                                  f"{safe_repr(declared)}.")
    # ArcticTraining adds the entries its bases do not have already (so
    # `callbacks = [*Base.callbacks, mine]` does not run Base's twice).
    new = [item for item in declared if item not in record.declared]
    record.declared += new
    entries = [_Entry(*_parse(item, where), f"class list {where}") for item in new]
    methods = sorted((attr, value) for attr, value in vars(cls).items() if _CALLBACK_METHOD.match(attr))
    for attr, value in methods:
        fn = value.__func__ if isinstance(value, staticmethod) else value
        if not isinstance(fn, FunctionType):
            continue  # ArcticTraining reads functions only (`pre_step_callback = None` included)
        m = _CALLBACK_METHOD.match(attr)
        assert m is not None
        event = f"{m.group(1)}-{m.group(2).replace('_', '-')}"
        if (event, fn) not in record.declared:
            entries.append(_Entry(event, fn, f"class method {cls.__qualname__}.{attr}"))
    # Events a base declared that only this class has: registered here now.
    for base in bases:
        record.resolved |= base.resolved
    for base in bases:
        for entry in base.pending:
            if entry in record.resolved or entry in record.pending:
                continue
            if _register(cls, entry):
                record.registered.append(entry)
                record.resolved.add(entry)
            else:
                record.pending.append(entry)
    for entry in entries:
        (record.registered if _register(cls, entry) else record.pending).append(entry)
    if "callbacks" in vars(cls):
        type.__setattr__(cls, "callbacks", _Frozen(declared))
    _records[cls] = record


def _check(cls: type) -> None:
    """At a class's first instantiation, as ArcticTraining: every callback it has
    names a wrapped method and fits its signature."""
    record = _records.get(cls)
    if record is None or record.checked:
        return
    for entry in record.pending:
        known = sorted({f"{p}-{n}" for n in _event_names(cls) for p in ("pre", "post")})
        raise entry._fail(cls, "names no method wrapped with @callback_wrapper."
                          + closest(entry.event, known) + f" Events of {cls.__qualname__}: {known}.")
    for klass in cls.__mro__:
        base = _records.get(klass)
        for entry in base.registered if base is not None else ():
            entry.plan(cls)
    record.checked = True


def _event_names(cls: type) -> set[str]:
    return {name for attr in dir(cls) for name in [_wrapped_name(inspect.getattr_static(cls, attr, None))]
            if name is not None}


# --- ArcticTraining's default callbacks (arctic_training/callback/logging.py) -----------
# Same events, messages and level (INFO); the functions keep its names, which its
# ordering log prints (`<Callback event=pre-init fn=_pre_init_log>`).

def _pre_init_log(self: Any) -> None:
    logger.info(f"Initializing {self.__class__.__name__}")


def _post_init_log(self: Any) -> None:
    logger.info(f"Initialized {self.__class__.__name__}")


def _log_callback_ordering(self: Any) -> None:
    if not logger.isEnabledFor(logging.INFO):
        return  # the line walks the class's attributes: not on every object for nothing
    # ArcticTraining's code as it is: a set (so the order is the strings' hashes'),
    # and split("-")[1] keeps "multi" of "multi-args", whose callbacks it lists as none.
    log_str = f"Callback methods for {self.__class__.__name__}:"
    wrapped_methods = set(event.split("-")[1] for event in self._get_all_callback_event_methods())
    for event in wrapped_methods:
        log_str += f"\n  {event}:"
        log_str += "\n\tPre-callbacks:"
        log_str += str([cb for cb in self._initialized_callbacks if cb.event == f"pre-{event}"])
        log_str += "\n\tPost-callbacks:"
        log_str += str([cb for cb in self._initialized_callbacks if cb.event == f"post-{event}"])
    logger.info(log_str)


pre_init_log_cb = ("pre-init", _pre_init_log)
post_init_log_cb = ("post-init", _post_init_log)
post_init_callback_ordering_cb = ("post-init", _log_callback_ordering)


class _NotInstantiated(FixedList):
    """``_initialized_callbacks`` of a class not instantiated yet (ArcticTraining sets it
    in ``__new__``; before, its empty list takes entries that never run)."""

    refusal = ("a CallbackMixin class's `_initialized_callbacks` is made when the class is instantiated: "
               "extend it on an object (`trainer._initialized_callbacks.extend(...)`, as ArcticTraining's "
               "Ray launcher does), or register with hookwrap: hw.before(cls, 'step', fn) / hw.after(...).")


class _Initialized(list):  # type: ignore[type-arg]
    """ArcticTraining's ``_initialized_callbacks``: the class's callbacks in the order they
    run, made when the class is instantiated and shared by its objects, as there.
    ArcticTraining's Ray launcher extends it with its ``Callback`` objects
    (arctic_training/launcher/ray_launcher.py, _attach_ray_callbacks): each added one
    is registered on the class, for objects of exactly this class (the list is
    theirs only), until the class is instantiated again and the list made anew."""

    refusal = ("`_initialized_callbacks` takes additions by append() and extend() only, as ArcticTraining's "
               "Ray launcher makes them (`+=` on an object would leave it a list of its own); to remove or "
               "reorder callbacks, register them with hookwrap (hw.before / hw.after / hw.around on the "
               "object or class) and remove the handle.")

    def __init__(self, owner: type, entries: list[_Entry]) -> None:
        super().__init__(entries)
        self._owner = owner
        self._handles: list[Any] = []

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise HookError(self.refusal)

    insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse

    def append(self, callback: Any) -> None:
        self.extend([callback])

    def extend(self, callbacks: Any) -> None:
        added = list(callbacks)
        plans = [self._plan(cb) for cb in added]  # all checked before any is registered
        with _lock:
            for cb, (name, phase) in zip(added, plans):
                advice = _added_advice(self._owner, cb, phase)
                self._handles.append(around(self._owner, name, advice, prepend=phase == "post"))
            super().extend(added)

    def _plan(self, cb: Any) -> tuple[str, str]:
        event = getattr(cb, "event", None)
        phase, _, name = event.partition("-") if isinstance(event, str) else ("", "", "")
        if phase not in ("pre", "post") or not name or not callable(cb):
            raise ArcticCallbackError(
                f"{self._owner.__qualname__}._initialized_callbacks holds ArcticTraining `Callback` objects "
                f"(Callback(event, fn, method), with `event` 'pre-<method>' or 'post-<method>', called as "
                f"cb(obj, args, kwargs)), got {safe_repr(cb)}; for a function of your own, use "
                f"hw.before / hw.after(obj, 'step', fn).")
        if not has_join_point(self._owner, name):
            known = sorted(self._owner._get_all_callback_event_methods())  # type: ignore[attr-defined]
            owner = self._owner.__qualname__
            raise ArcticCallbackError(f"{owner}: callback {safe_repr(cb)} for {event!r} names no method wrapped "
                                      f"with @callback_wrapper." + closest(f"{phase}-{name}", known)
                                      + f" Events of {owner}: {known}.")
        return name, phase

    def drop(self) -> None:
        """The class is instantiated again: what was added to this list stops running."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _added_advice(owner: type, cb: Any, phase: str) -> Callable[..., Any]:
    """An ArcticTraining ``Callback`` as around advice, called as its ``_run_callbacks``
    calls it: ``args, kwargs = cb(obj, args, kwargs)`` (pre), ``value, _ = cb(obj, value, {})``."""
    if phase == "pre":
        def advice(self: Any, proceed: Any, *args: Any, **kwargs: Any) -> Any:
            if type(self) is owner:
                args, kwargs = cb(self, args, kwargs)
            return proceed(*args, **kwargs)
    else:
        def advice(self: Any, proceed: Any, *args: Any, **kwargs: Any) -> Any:
            value = proceed(*args, **kwargs)
            if type(self) is owner:
                value, _ = cb(self, value, {})
            return value
    fn = getattr(cb, "fn", cb)
    advice.__name__ = getattr(fn, "__name__", "callback")
    advice.__qualname__ = getattr(fn, "__qualname__", None) or safe_repr(cb)
    return advice


def _remake_initialized(cls: type) -> None:
    """ArcticTraining's ``__new__``: the class's list made anew, what was added dropped."""
    old = vars(cls).get("_initialized_callbacks")
    if isinstance(old, _Initialized):
        old.drop()
    entries = [entry for klass in reversed(cls.__mro__) if klass in _records
               for entry in _records[klass].registered]
    type.__setattr__(cls, "_initialized_callbacks", _Initialized(cls, entries))


class CallbackMixin:
    """ArcticTraining's ``CallbackMixin`` on hookwrap: ``__init__`` is join point
    ``init``; callbacks come from ``callbacks`` lists and ``{pre|post}_<name>_callback``
    methods, base class first (see the module docstring)."""

    # ArcticTraining's defaults: a subclass that does not declare `callbacks` inherits
    # them; one that does has its own list only (its bases' lists still add to it).
    callbacks: list[tuple[str, Callable[..., Any]]] = _Frozen(
        [pre_init_log_cb, post_init_log_cb, post_init_callback_ordering_cb])

    _initialized_callbacks: list[Any] = _NotInstantiated()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        with _lock:
            _rewrap(cls)
            _prepare(cls)

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        with _lock:
            _check(cls)
            _remake_initialized(cls)
        return super().__new__(cls)

    @classmethod
    def _get_all_callback_event_methods(cls) -> dict[str, Callable[..., Any]]:
        """ArcticTraining's: ``pre-<name>`` and ``post-<name>`` -> the method wrapped as
        ``name``, by attribute name (its Ray launcher makes ``Callback`` objects of them)."""
        methods: dict[str, Callable[..., Any]] = {}
        for attr in dir(cls):  # sorted, as its inspect.getmembers
            name = _wrapped_name(inspect.getattr_static(cls, attr, None))
            if name is not None:
                methods["pre-" + name] = methods["post-" + name] = getattr(cls, attr)
        return methods

    @callback_wrapper("init")
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # ArcticTraining's own pre-init callback (a log line) passes the method its
        # arguments by keyword without `args` and `kwargs`: so the next class's
        # __init__ is called with none, on every ArcticTraining class.
        super().__init__()


# ArcticTraining's `-> None` is the object None (its module has no `from __future__
# import annotations`, this one has): so its post-init callbacks take `self` only.
vars(CallbackMixin)["__init__"].__wrapped__.__annotations__["return"] = None
