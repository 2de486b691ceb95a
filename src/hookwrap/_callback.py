"""Callback objects and their life: ``Callback`` classes attached to a target or
to the global tier, deferred work settled at boundaries that always come
(``Defers``), and their state saved and resumed with the object's
(``callback_state`` / ``load_callback_state``).

Class-based callbacks (Lightning / pytorch-accelerated / Cerebras style): a
``Callback`` subclass defines methods named after events, ``-`` written as
``_``: ``pre_loss(self, trainer, batch)``, ``post_step(self, trainer,
return_value)``, ``around_step(self, trainer, proceed, *args, **kwargs)``,
``error_step(self, trainer, exception)``, ``on_validation_end(self, trainer,
metrics)``. Each follows the rules of function callbacks. A method whose name
looks like an event but matches none is refused with the closest names: none
of the libraries hookwrap replaces catches such typos, they never fire.

A callback that defers (device values queued for a batched read, rows not yet
written, NaN checks not yet decided) is an optimisation, and must never turn
into a loss. ``Defers`` gives such a callback one lifecycle. It reads back at the
points it declares itself (NanGuard every ``check_every`` checks, MetricsLogger
every ``flush_secs`` and at each epoch's end), never once per call, and
whatever it holds is settled

* when the run's own join point (``fit``, where the target has it) ends: it
  returned, ``StopTraining`` left it, or another exception did;
* when the outermost running ``fit`` of *any* object ends, for the objects it
  drove (a GAN's ``a.fit`` driving ``b.step``: ``b``'s values);
* at the end of a ``hookwrap run`` script, or of a ``with boundary():`` block;
* when ``hookwrap.callback_state(obj)`` is taken (a checkpoint must not hide a
  check still queued), or the callback's handle is removed;
* on a termination signal (SIGTERM; others with ``settle_on_signals``), before
  the signal takes its course (the process ends with the status it would have
  had without hookwrap, or the handler the program installed runs);
* at interpreter exit, where anything still pending is settled and reported on
  stderr, loudly; a check that fails there makes the exit status 1.

The run's boundary is around advice and a post callback the registration adds
to the run's own join point (``describe()`` shows ``settle_at_run_end``): once a
run, nothing on the other join points. A loop with no ``fit`` (a module-level
script, a class nobody edited) pays nothing per call: its values are read at
the callbacks' own points and delivered at the endings above (weave the loop's
own method as ``fit``, or run it in ``with boundary():``, to have them at the
loop's end).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import signal
import sys
import threading
import weakref
from collections.abc import Iterator, Mapping
from threading import get_ident
from types import ModuleType
from typing import Any, Callable, NamedTuple, TypeVar

from ._describe import describe
from ._entries import (
    CUSTOM,
    PHASES,
    Options,
    Registration,
    callback_object_event,
    make_options,
    normalize,
    parse_event,
)
from ._joinpoints import (
    READER_PHASE_ATTR,
    all_join_points,
    declared_custom_events,
    join_point_of,
    per_join_point,
    reader,
    target_join_points,
)
from ._plain import check_plain
from ._registry import Handle, register_entries, register_global, registered_on
from .errors import (
    CallbackSignatureError,
    HookError,
    StopTraining,
    UnknownEventError,
    closest,
    safe_repr,
)

__all__ = [
    "Callback",
    "CallbackState",
    "Defers",
    "Ending",
    "NotACallbackError",
    "SettlingHandle",
    "add_callback",
    "boundary",
    "callback_events",
    "callback_state",
    "deferring_callbacks",
    "is_boundary",
    "load_callback_state",
    "register_global_callback",
    "settle_all",
    "settle_attached",
    "settle_driven",
    "settle_on_signals",
    "signal_course",
    "settling",
    "stateful_callbacks",
    "track_deferring",
]


# --- Deferred work, and a callback's state ---------------------------------------

log = logging.getLogger(__name__)  # under "hookwrap": callback states loaded, at INFO

# --- Deferred work, settled at boundaries ----------------------------------------

class Ending(NamedTuple):
    """How a boundary came: ``where`` it is, and what left the call there."""

    where: str
    """``"fit"`` (the run's own join point ended), ``"outermost"`` (the hooked
    object's outermost call of another join point ended), ``"state"``
    (``callback_state``), ``"removed"`` (the callback's handle was removed),
    ``"driver"`` (the outermost running ``fit`` of another object, which drove
    this one's calls, ended), ``"script"`` (a ``hookwrap run`` script or a
    ``boundary()`` block ended), ``"signal"`` (a termination signal came: deliver,
    the process may end next) or ``"exit"`` (the interpreter is exiting)."""
    exception: BaseException | None = None
    """What left the call (``StopTraining`` included); None when it returned."""

    @property
    def stopped(self) -> bool:
        """The run was ended by ``StopTraining``: a normal end."""
        return isinstance(self.exception, StopTraining)

    @property
    def failed(self) -> bool:
        """Another exception is leaving (``KeyboardInterrupt`` included): settle without
        raising over it (add notes; for one whose notes are not printed, say so on
        stderr)."""
        return self.exception is not None and not self.stopped

    @property
    def run_ended(self) -> bool:
        """Nothing more of this run is sure to come (loggers may finalize)."""
        return self.where in ("fit", "script", "exit")


# Every attached deferring callback, weakly: one nothing else holds is not kept for this.
_DEFERRING: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_script_depth = 0  # `hookwrap run` scripts running: their end is a boundary that will come


class Defers:
    """Mixed into a ``hookwrap.Callback`` that defers work, before the callback's
    own base (``class MyLogger(Defers, hw.Callback)``). Implement
    ``settle(obj, ending)``; optionally ``pending()`` and ``run_event``.

    ``settle(obj, ending)`` delivers what is held for hooked object ``obj``
    (``None``: a function's, or everything, at a process-wide boundary). With
    ``ending.failed`` it must not raise (note what it found on
    ``ending.exception`` instead); otherwise it may raise, which ends the run
    (a NaN found at the end of ``fit`` raises there)."""

    run_event: Any = "fit"
    """The join point of a whole run: where the target has it, its end is the
    boundary; elsewhere the outermost call of each join point is."""
    _settled_for = 0  # id() of the error a boundary settled on last
    _run_ending = False  # its run returned, its post callback (which settles it) not yet run

    def settle(self, obj: Any, ending: Ending) -> None:
        raise NotImplementedError(f"{type(self).__qualname__} defers, and must define settle(obj, ending)")

    def __getstate__(self) -> dict[str, Any]:
        got: Any = super().__getstate__()
        state = dict(got if got is not None else self.__dict__)
        for per_process in ("_depth", "_settled_for", "_run_ending"):  # calls in flight here, not in the copy
            state.pop(per_process, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._depth: dict[tuple[int, int], int] = {}
        if self.defers():
            track_deferring(self)  # a copy (torch.load, deepcopy) is settled at exit too

    def defers(self) -> bool:
        """Whether this callback holds anything back as set up (a monitor whose values
        are only read on demand does not): no boundary advice where it does not."""
        return True

    def pending(self) -> str:
        """What is held and not yet delivered, for the report at exit ("3 rows"); ''
        when nothing that could be lost is."""
        return ""

    def in_boundary(self, obj: Any) -> bool:
        """Is a boundary of this callback open on ``obj`` in this thread (its run, or
        its outermost call, still running; or a ``hookwrap run`` script)? Where none
        is, what arrives now has no end that will deliver it: deliver it at once."""
        return bool(getattr(self, "_depth", {}).get((get_ident(), id(obj)))) or bool(_script_depth)

    # --- the boundaries -------------------------------------------------------------

    def with_boundaries(self, target: Any, pairs: list[tuple[str, Callable[..., Any]]]) \
            -> list[tuple[str, Callable[..., Any]]]:
        """``pairs`` (what ``event_methods`` returned) and the boundary advice; called
        by the registration, whatever ``event_methods`` a subclass defines."""
        if not self.defers():
            return pairs
        track_deferring(self)
        return pairs + self.boundary_advice(target, pairs)

    def boundary_advice(self, target: Any, pairs: list[tuple[str, Callable[..., Any]]]) \
            -> list[tuple[str, Callable[..., Any]]]:
        """Advice on the run's own join point (``run_event``) where the target has it
        (for the global tier: wherever one exists). Nothing on the other join points:
        a loop with no run is read at the callback's own points and settled at the
        endings (see the module's docstring), never once per call."""
        if not hasattr(self, "_depth"):
            self._depth = {}
        run = normalize(self.run_event) if self.run_event else None
        if run is None:
            return []
        if target is None:  # the global tier: every join point of the run's name
            found = [jp for jp in all_join_points() if normalize(jp.event) == run]
        else:
            jp = target_join_points(target).get(run)
            found = [jp] if jp is not None else []
        if not found:
            return []
        event = found[0].event
        if any(jp.run_wrapped is not None for jp in found):
            # A coroutine's or generator's call returns before it runs: no around
            # advice; a run's post and error callbacks run when it has (after the
            # body, inside the coroutine), so they settle there.
            return [(f"post-{event}", _marked(reader(self._settle_after_run, "post-"))),
                    (f"error-{event}", _marked(reader(self._settle_after_failed_run, "error-", "exception")))]
        # Chosen per join point when planned (a method's advice gets the object, a
        # function's does not): the global tier reaches both, and ones made later.
        around = _marked(per_join_point(self, "settle_at_run_end",
                                        functools.partial(_by_object, self.settle_at_run_end,
                                                          self.settle_at_run_end_fn)))
        # A post callback of the run's own raising is seen by the error callback.
        return [(f"around-{event}", around), (f"post-{event}", _marked(reader(self._settle_after_run, "post-"))),
                (f"error-{event}", _marked(reader(self._settle_after_failed_run, "error-", "exception")))]

    # The boundary is the end of the run's call *with its post callbacks* (where
    # values are queued): around advice counts the depth and settles when an
    # exception leaves; a post callback, after the callback's own, settles a return.
    # One around method per kind of join point (a method's advice gets the object; a
    # function's does not).

    def settle_at_run_end(self, obj: Any, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The run's own join point: settle when it ends, however it ends."""
        return self._boundary(obj, proceed, args, kwargs)

    def settle_at_run_end_fn(self, proceed: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._boundary(None, proceed, args, kwargs)

    def _boundary(self, obj: Any, proceed: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
        depth = self._depth
        thread = get_ident()
        key = (thread, id(obj))  # per thread: another thread's call is not nested in this one
        outer = depth.get(key, 0)
        depth[key] = outer + 1
        if not outer:
            _runs_open[thread] = _runs_open.get(thread, 0) + 1
        try:
            return proceed(*args, **kwargs)
        except BaseException as exc:
            if not outer:
                del depth[key]
                _run_closed(thread)
                self._settled_for = id(exc)  # the run's error callback then sees it settled (an id:
                # the exception would keep its frames alive)
                # sys.exit(0) inside the run ends it normally (a NaN found then ends it instead);
                # KeyboardInterrupt and other exits leave as failures, what was held written.
                ending = Ending("fit", None if isinstance(exc, SystemExit) and exc.code in (None, 0) else exc)
                try:
                    self.settle(obj, ending)
                finally:
                    if not _runs_open.get(thread):
                        settle_driven(Ending("driver", ending.exception))
            raise
        finally:
            if outer:
                depth[key] = outer
            elif key in depth:  # returned: its post callback settles it, next
                del depth[key]
                _run_closed(thread)
                self._run_ending = True

    def holds_run_open(self) -> bool:
        """Is a run of this callback's (its ``fit``) still running, in any thread?"""
        return any(getattr(self, "_depth", {}).values()) or self._run_ending

    def _settle_after_run(self, obj: Any) -> None:
        if not self._depth.get((get_ident(), id(obj))):
            self._run_ending = False
            try:
                self.settle(obj, Ending("fit"))
            finally:
                if not _runs_open.get(get_ident()):
                    settle_driven(Ending("driver"))

    def _settle_after_failed_run(self, obj: Any, exception: BaseException) -> None:
        if not self._depth.get((get_ident(), id(obj))) and self._settled_for != id(exception):
            self.settle(obj, Ending("fit", exception))


# Runs (any deferring callback's fit) open per thread: when the outermost ends, the
# objects it drove are settled (settle_driven).
_runs_open: dict[int, int] = {}


def _run_closed(thread: int) -> None:
    left = _runs_open.get(thread, 1) - 1
    if left:
        _runs_open[thread] = left
    else:
        _runs_open.pop(thread, None)


def settle_driven(ending: Ending) -> None:
    """The outermost running ``fit`` of a thread ended: every deferring callback still
    holding something, whose own run is not running, is settled (a trainer driven by
    another's ``fit``, whose own ``fit`` never runs). The first error raises after
    every callback had its turn (the others noted on it); when the run is already
    failing, they are notes on its exception."""
    errors: list[tuple[Defers, BaseException]] = []
    for cb in deferring_callbacks():
        if cb.holds_run_open() or not cb.pending():
            continue
        try:
            cb.settle(None, ending)
        except Exception as exc:  # noqa: BLE001 - every callback gets its turn
            errors.append((cb, exc))
    _raise_or_note(errors, ending.exception, "at the end of the run that drove it")


def _raise_or_note(errors: list[tuple[Defers, BaseException]], leaving: BaseException | None, when: str) -> None:
    """Errors settling raised: the first raised (the others noted on it), or, when
    ``leaving`` is already going, each noted on it."""
    if not errors:
        return
    if leaving is None:
        first = errors[0][1]
        for cb, other in errors[1:]:
            first.add_note(f"hookwrap: also, {type(cb).__name__}: {type(other).__name__}: {other}")
        raise first
    for cb, error in errors:
        leaving.add_note(f"hookwrap: {type(cb).__name__} {when}: {type(error).__name__}: {error}")


_BOUNDARY_ATTR = "__hookwrap_boundary__"  # on each boundary callable boundary_advice makes


def _marked(fn: Any) -> Any:
    vars(fn)[_BOUNDARY_ATTR] = True
    return fn


def _by_object(with_object: Any, without_object: Any, spec: Any) -> Any:
    return with_object if spec.has_obj else without_object


def is_boundary(fn: Any) -> bool:
    """Is ``fn`` (a registered callable) one of a Defers' boundaries?"""
    return bool(getattr(fn, "__dict__", {}).get(_BOUNDARY_ATTR))


class SettlingHandle(Handle):
    """A deferring callback's handle: ``remove()`` settles what it holds first (the
    rows it was given are written, a NaN it queued is reported), as a callback
    removed mid-run would otherwise take them with it."""

    __slots__ = ("_settle",)

    def __init__(self, handle: Handle, settle: Callable[[], None]) -> None:
        super().__init__(handle._places)
        self._settle: Callable[[], None] | None = settle

    def remove(self) -> None:
        settle, self._settle = self._settle, None
        try:
            if settle is not None and self.active:
                settle()  # may raise (a NaN it held): removed all the same
        finally:
            super().remove()


def settling(handle: Handle, cb: Any, target: Any) -> Handle:
    """``handle``, settling ``cb`` when removed where ``cb`` defers."""
    if not isinstance(cb, Defers):
        return handle
    # an object's own callbacks settle for it; a class's, a function's, a module's for all
    obj = None if isinstance(target, (type, ModuleType)) or join_point_of(target) is not None else target
    return SettlingHandle(handle, functools.partial(cb.settle, obj, Ending("removed")))


def track_deferring(cb: Defers) -> None:
    """Settle ``cb`` at the process-wide boundaries (a script's end, a termination
    signal, exit) even before it is attached: a logger other callbacks log into may
    never be."""
    with _lock:
        _DEFERRING.add(cb)
    _SIGNALS.install()
    _settle_after_each_cell()


_cells_watched = False


def _settle_after_each_cell() -> None:
    """In IPython or Jupyter, the end of each cell is a boundary that always comes (a
    notebook never exits): what a loop with no ``fit`` left held arrives there."""
    global _cells_watched  # noqa: PLW0603
    if _cells_watched or "IPython" not in sys.modules:
        return
    shell = getattr(sys.modules["IPython"], "get_ipython", lambda: None)()
    events = getattr(shell, "events", None)
    if events is None:
        return
    _cells_watched = True

    def after_cell(*args: Any) -> None:
        _raise_or_note(settle_all(Ending("script")), None, "at the end of the cell")

    events.register("post_run_cell", after_cell)


def deferring_callbacks() -> list[Defers]:
    """The deferring callbacks attached anywhere in this process (alive)."""
    with _lock:
        return list(_DEFERRING)


def settle_attached(obj: Any, ending: Ending) -> None:
    """Settle the deferring callbacks attached to ``obj`` (any tier)."""
    for cb in describe(obj).callback_objects():
        if isinstance(cb, Defers):
            cb.settle(obj, ending)


def settle_all(ending: Ending) -> list[tuple[Defers, BaseException]]:
    """Settle every deferring callback of the process (a ``hookwrap run`` script
    ended, the interpreter exits). Each is settled even when another raised; the
    errors are returned, in order, for the caller to raise or report."""
    errors: list[tuple[Defers, BaseException]] = []
    for cb in deferring_callbacks():
        try:
            cb.settle(None, ending)
        except Exception as exc:  # noqa: BLE001 - every callback gets its turn
            errors.append((cb, exc))
    return errors


@contextlib.contextmanager
def boundary() -> Iterator[None]:
    """A block whose end is a boundary that will come: ``hookwrap run`` runs a
    script in one, and a loop of plain functions may run in one too (``with
    boundary(): for batch in data: step(batch)``). At its end every deferring
    callback is settled (what the loop's last steps left held arrives there, not
    at interpreter exit). An error a
    callback raises there propagates (the first; the others as notes), unless the
    block is already leaving by an exception, which then goes on."""
    global _script_depth  # noqa: PLW0603
    with _lock:
        _script_depth += 1
    leaving: BaseException | None = None
    try:
        yield
    except SystemExit as exc:
        leaving = None if exc.code in (None, 0) else exc  # sys.exit(0): a normal end
        raise
    except BaseException as exc:
        leaving = exc
        raise
    finally:
        with _lock:
            _script_depth -= 1
        ending = Ending("script", leaving)
        errors = settle_all(ending)
        if ending.failed:  # its own error goes on: these are said beside it
            for cb, error in errors:
                print(f"hookwrap: {type(cb).__name__} at the end of the script: {type(error).__name__}: {error}",
                      file=sys.stderr)
        _raise_or_note(errors, leaving if ending.failed else None, "at the end of the script")


def _at_exit() -> None:
    """Interpreter exit: settle what is still held, and say so on stderr. A check
    that fails here (a NaN found last) makes the exit status 1: a scheduler or CI
    must not record the run as a success."""
    held = [(cb, cb.pending()) for cb in deferring_callbacks()]
    held = [(cb, what) for cb, what in held if what]
    errors = settle_all(Ending("exit"))
    for cb, what in held:
        print(f"hookwrap: at interpreter exit, {getattr(cb, 'state_key', type(cb).__name__)} still held "
              f"{what}, delivered now: no boundary it settles at (the end of fit, of a with "
              f"hookwrap.extend.boundary() block, or of a hookwrap run script) ended before the "
              f"interpreter did. See 'Nothing lost' in the shipped callbacks guide.", file=sys.stderr)
    for cb, exc in errors:
        print(f"hookwrap: at interpreter exit, {getattr(cb, 'state_key', type(cb).__name__)} found: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
    if errors:
        print("hookwrap: exiting with status 1: a callback found the run failed only at interpreter exit.",
              file=sys.stderr)
        # No other way to change the status from an exit handler: what os._exit skips
        # (the handlers registered before hookwrap's, logging's among them) is done first.
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(1)


# --- Termination signals: what is held delivered, then the signal's own course ------

class _Signals:
    """The handlers that deliver what deferring callbacks hold when a termination
    signal comes, then hand the signal on: to the handler the program had installed,
    else its default action (the process ends with the status the signal gives it).
    Installed in the main thread once something defers, over the default action or
    a Python handler only (an ignored signal stays ignored)."""

    def __init__(self) -> None:
        self.wanted: tuple[int, ...] = (signal.SIGTERM,)
        self.previous: dict[int, Any] = {}  # signal -> the handler ours replaced
        self.pid = 0  # the process that installed them (a forked worker inherits them)

    def install(self) -> None:
        if all(number in self.previous for number in self.wanted) \
                or threading.current_thread() is not threading.main_thread():
            return  # done, or not possible here: the next registration in the main thread tries again
        self.pid = os.getpid()
        for number in self.wanted:
            if number in self.previous:
                continue
            current = signal.getsignal(number)
            if current == signal.SIG_IGN or current is None:
                continue  # ignored; set from outside Python: left alone
            self.previous[number] = current
            signal.signal(number, self.handle)

    def uninstall(self, keep: tuple[int, ...] = ()) -> None:
        """Ours replaced by what was there before, except for ``keep``."""
        for number in [n for n in self.previous if n not in keep]:
            if signal.getsignal(number) == self.handle:
                signal.signal(number, self.previous[number])
            del self.previous[number]

    def handle(self, signum: int, frame: Any) -> None:
        if os.getpid() != self.pid:  # a forked worker (a DataLoader's): its copies are not the run's
            self.hand_on(signum, frame)
            return
        self.deliver(signum)
        if signal.getsignal(signum) != self.handle:
            return  # called by the handler that replaced ours (Lightning's chains to it): it decides
        self.hand_on(signum, frame)

    def deliver(self, signum: int) -> None:
        """Every deferring callback settled (nothing raised over the signal: reported)."""
        for cb, exc in settle_all(Ending("signal")):  # each settled, whatever the others raised
            print(f"hookwrap: on {signal.Signals(signum).name}, {getattr(cb, 'state_key', type(cb).__name__)} "
                  f"found: {type(exc).__name__}: {exc}", file=sys.stderr)

    def course(self, signum: int, handler: Any) -> Any:
        """``handler``, or where it is ours, the one ours hands the signal on to."""
        while True:  # hookwrap's, of this copy or another (a reimport), over each other
            owner: Any = getattr(handler, "__self__", None)
            previous = getattr(owner, "previous", None)
            if not (type(owner).__name__ == "_Signals" and isinstance(previous, dict)):
                return handler
            handler = previous.get(signum, signal.SIG_DFL)

    def hand_on(self, signum: int, frame: Any) -> None:
        """The signal as the process would have had it without hookwrap."""
        previous = self.previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)  # the program's own handler (it may exit, raise, or go on)
            return
        # The default action: end the process by the signal itself (the same status).
        self.previous.pop(signum, None)
        signal.signal(signum, signal.SIG_DFL)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.kill(os.getpid(), signum)


_SIGNALS = _Signals()


def signal_course(signum: int, handler: Any) -> Any:
    """``handler`` as a signal's course: where it is hookwrap's own (what deferring
    callbacks hold delivered, then handed on), the handler it hands on to."""
    return _SIGNALS.course(signum, handler)


def settle_on_signals(*signals: Any) -> tuple[int, ...]:
    """The signals on which what deferring callbacks hold is delivered before the
    signal takes its course (default: SIGTERM, how SLURM, Kubernetes and most
    schedulers stop a job). Add SIGINT, SIGHUP, SIGUSR1 or SIGUSR2 (numbers or
    names; ``settle_on_signals("SIGTERM", "SIGUSR1")``); returns them as numbers.
    Call it in the main thread."""
    valid = signal.valid_signals()
    numbers: list[int] = []
    for one in signals:
        number: Any = getattr(signal, one if one.startswith("SIG") else f"SIG{one}", None) \
            if isinstance(one, str) else one
        if isinstance(number, bool) or not isinstance(number, int) or number not in valid \
                or number in (getattr(signal, "SIGKILL", -1), getattr(signal, "SIGSTOP", -1)):
            raise HookError(f"settle_on_signals: {one!r} is not a signal that can be caught on this platform; "
                            f"pass signal.SIGTERM, 'SIGUSR1', ...")
        if int(number) not in numbers:
            numbers.append(int(number))
    if not numbers:
        raise HookError("settle_on_signals: name at least one signal (signal.SIGTERM).")
    if threading.current_thread() is not threading.main_thread():
        raise HookError("settle_on_signals: Python sets signal handlers in the main thread only; call it there.")
    _SIGNALS.wanted = tuple(numbers)
    _SIGNALS.uninstall(keep=_SIGNALS.wanted)
    if _DEFERRING:
        _SIGNALS.install()
    return _SIGNALS.wanted


atexit.register(_at_exit)


# --- Saving and resuming callbacks' state ----------------------------------------

def stateful_callbacks(obj: Any, where: str = "stateful_callbacks") -> dict[str, Any]:
    """``state_key -> callback`` for each callback object with ``state_dict()`` attached
    to ``obj`` in any tier, in chain order. A key taken already gets ``#2``, ``#3``, ...
    (two callbacks of one class and settings, in the order they were attached)."""
    try:
        owners = describe(obj).callback_objects()
    except HookError as exc:  # told as this function's error: the object is what was passed
        raise HookError(f"{where}({type(obj).__qualname__}): {exc}") from None
    return keyed_by_state_key(owners)


def keyed_by_state_key(callbacks: Any) -> dict[str, Any]:
    """``state_key -> callback`` for each of ``callbacks`` with ``state_dict()`` and
    ``load_state_dict()``, in order; a key taken already gets ``#2``, ``#3``, ..."""
    keyed: dict[str, Any] = {}
    for cb in callbacks:
        if not (callable(getattr(cb, "state_dict", None)) and callable(getattr(cb, "load_state_dict", None))):
            continue
        base = getattr(cb, "state_key", type(cb).__qualname__)
        key, n = base, 1
        while key in keyed:
            n += 1
            key = f"{base}#{n}"
        keyed[key] = cb
    return keyed


def callback_state(obj: Any) -> dict[str, Any]:
    """The ``state_dict()`` of every stateful callback attached to ``obj``, by
    ``state_key``. Save it beside the model's: ``torch.save({"model": ...,
    "callbacks": hookwrap.callback_state(trainer)}, path)``.

    What a deferring callback attached to ``obj`` still holds is settled first
    (``hookwrap.extend.Defers``): a NaN check still queued raises here, as it
    would have later in the run, rather than being lost with the process."""
    settle_attached(obj, Ending("state"))
    return {key: cb.state_dict() for key, cb in stateful_callbacks(obj, "callback_state").items()}


def load_callback_state(obj: Any, state: dict[str, Any], strict: bool = True) -> None:
    """Give each callback attached to ``obj`` its saved state. With ``strict`` (the
    default), a saved state that no attached callback takes, or an attached stateful
    callback with no saved state, is an error: attach the same callbacks, in the same
    order, before loading. ``state`` must be plain data (dicts, lists, numbers,
    strings, None, tensors), as ``callback_state`` returns it: anything else, what a
    file loaded with ``weights_only=False`` could hold, is refused before any callback
    sees it."""
    if not isinstance(state, dict):
        raise HookError(f"load_callback_state: expected the dict callback_state() returned, "
                        f"got {type(state).__name__}.")
    where = f"load_callback_state({type(obj).__qualname__})"
    attached = stateful_callbacks(obj, "load_callback_state")
    loaded = load_keyed_state(attached, state, where, "Attach the same callbacks as when the state was saved "
                              "before loading, or pass strict=False to load what matches." if strict else None)
    if loaded:
        log.info("load_callback_state(%s): loaded %s", type(obj).__qualname__, ", ".join(loaded))


def load_keyed_state(attached: dict[str, Any], state: dict[str, Any], where: str, mismatch: str | None) -> list[str]:
    """Give each of ``attached`` (callbacks by state key) its entry of ``state``, all or
    nothing, and return the keys loaded. ``state`` must be plain data (what a file
    loaded with ``weights_only=False`` could hold is refused before any callback sees
    it). Keys that differ are an error ending with ``mismatch`` (the fix), or, with
    None, skipped. ``where`` begins every error."""
    check_plain(state, where, "the state given")
    unused = sorted(set(state) - set(attached))
    missing = sorted(set(attached) - set(state))
    if mismatch is not None and (unused or missing):
        raise HookError(
            f"{where}: "
            + (f"saved state for {', '.join(map(repr, unused))}, which no attached callback takes"
               if unused else "")
            + ("; " if unused and missing else "")
            + (f"no saved state for attached {', '.join(map(repr, missing))}" if missing else "")
            + f". {mismatch}"
        )
    for key in attached:
        if key in state and not isinstance(state[key], Mapping):
            raise HookError(
                f"{where}: the state saved for {key!r} is a {type(state[key]).__name__}, not the dict its "
                f"state_dict() returns. Load the 'callbacks' entry that hookwrap.callback_state() saved."
            )
    before = {key: cb.state_dict() for key, cb in attached.items() if key in state}
    loaded: list[str] = []
    for key, cb in attached.items():
        if key not in state:
            continue
        try:
            cb.load_state_dict(state[key])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            for done in loaded + [key]:  # all or nothing: the callbacks as they were
                attached[done].load_state_dict(before[done])
            raise HookError(
                f"{where}: {key!r} could not load its saved state ({type(exc).__name__}: {exc}); nothing was "
                f"loaded. Was it saved from a callback of the same kind and version?"
            ) from exc
        loaded.append(key)
    return loaded


class CallbackState:
    """The callbacks attached to ``obj`` as one object with ``state_dict()`` and
    ``load_state_dict(state)``, for checkpoint systems that save such objects beside
    the model: ignite's ``Checkpoint(to_save={..., "hookwrap": CallbackState(trainer)})``,
    ``accelerator.register_for_checkpointing(CallbackState(accelerator))``, Fabric's
    ``fabric.save(path, {..., "hookwrap": CallbackState(fabric)})``. Each call reads or
    loads the callbacks attached at that moment (``callback_state``,
    ``load_callback_state``, strict)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def state_dict(self) -> dict[str, Any]:
        return callback_state(self.obj)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_callback_state(self.obj, state)

    def __repr__(self) -> str:
        return f"hookwrap.CallbackState({type(self.obj).__qualname__})"


# --- Callback objects ------------------------------------------------------------

class NotACallbackError(HookError, TypeError):
    """``add_callback``/``register_global_callback`` given something that is not a
    ``Callback`` (nor, for the global tier, an ``("event", fn)`` pair). A TypeError
    too, as it always was."""


_blocks_lock = threading.RLock()  # a Callback's `with` blocks (an RLock: registering may re-enter)


_C = TypeVar("_C", bound="Callback")  # __enter__ returns the callback as its own class


class Callback:
    """Base class of class-based callbacks; also a context manager that registers
    the callback globally for the duration of a ``with`` block."""

    _hookwrap_handle: Handle | None = None
    # True: every event method fires only in the process of rank 0 (torch.distributed),
    # as if registered with rank_zero_only=True. For callbacks that only print or write.
    rank_zero_only: bool = False

    def event_methods(self, target: Any) -> list[tuple[str, Callable[..., Any]]]:
        """The ``(event, callable)`` pairs this callback registers when attached to
        objects of class ``target``, to a hookable function or a module of them
        (``None``: the global tier).

        By default, its methods named after events (``post_loss`` -> ``"post-loss"``).
        Override it to choose events when attached: hookwrap.torch's callbacks
        attach to the events named in their constructor, and check them against
        ``target`` here, so a bad name fails at attach time, with what
        ``hookwrap.extend`` offers (``join_points``, ``reader``, ``per_join_point``).
        """
        return [(_event_string(phase, name), method)
                for _, phase, name, method in callback_events(self)]

    @property
    def state_key(self) -> str:
        """Names this callback's entry in ``hookwrap.callback_state(obj)``. The class
        name by default; callbacks that may be attached twice with different settings
        add those (``EarlyStopping[monitor=val_loss,mode=min]``)."""
        return type(self).__qualname__

    # How many `with` blocks of this callback are open (any thread): registered once
    # while one is, removed when the last closes. Nested and concurrent blocks nest.
    _hookwrap_blocks: int = 0

    def __enter__(self: _C) -> _C:  # `with StepTimer() as timer:` is a StepTimer
        with _blocks_lock:
            if not self._hookwrap_blocks:
                self._hookwrap_handle = register_global_callback(self)
            self._hookwrap_blocks += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with _blocks_lock:
            if not self._hookwrap_blocks:
                return  # an exit without its enter: nothing of this block is registered
            self._hookwrap_blocks -= 1
            if self._hookwrap_blocks:
                return
            handle, self._hookwrap_handle = self._hookwrap_handle, None
            # Removed under the lock: a block another thread opens right after this
            # one closed must not register while this registration is still live
            # (a call in between would run the callback twice).
            if handle is not None:
                handle.remove()


def callback_events(cb: Callback) -> list[tuple[str, str, str, Any]]:
    """``(attribute, phase, event name, bound method)`` for each event method of ``cb``,
    base class first, in definition order."""
    seen: set[str] = set()
    out = []
    for klass in reversed(type(cb).__mro__):
        if klass in (Callback, object):
            continue
        for attr in vars(klass):
            if attr in seen or attr.startswith("_"):
                continue
            parsed = callback_object_event(attr)
            if parsed is None:
                continue
            seen.add(attr)
            if _class_level_partial(cb, attr):
                raise HookError(
                    f"{type(cb).__qualname__}.{attr} is a functools.partial in the class body, which "
                    f"Python 3.13 warns about and later versions bind like a method (passing the callback "
                    f"object). Define `def {attr}(self, ...)`, or wrap it: {attr} = staticmethod(partial(...))."
                )
            method = getattr(cb, attr)  # the most derived definition
            if method is None:  # a subclass turning its base's event method off
                continue
            if not callable(method):
                raise HookError(
                    f"{type(cb).__qualname__}.{attr} is named like an event method but is a "
                    f"{type(method).__name__} ({safe_repr(method)}), not a method. Define `def {attr}(self, ...)`, "
                    f"or give the attribute a name without a pre_/post_/around_/error_/on_ prefix."
                )
            out.append((attr, parsed[0], parsed[1], method))
    return out


def _class_level_partial(cb: Any, attr: str) -> bool:
    """Is ``attr`` of ``cb`` a ``functools.partial`` its class holds (not one set on the object)?"""
    if attr in getattr(cb, "__dict__", ()):
        return False
    for klass in type(cb).__mro__:
        if attr in vars(klass):
            return type(vars(klass)[attr]) is functools.partial
    return False


def _event_string(phase: str, name: str) -> str:
    return name if phase == CUSTOM else f"{phase}-{name}"


def _unknown(cb: Callback, attr: str, known_events: list[str], where: str) -> UnknownEventError:
    method_names = [e.replace("-", "_") for e in known_events]
    return UnknownEventError(
        f"{where}: {type(cb).__qualname__}.{attr} looks like an event method, but no such event "
        f"exists." + closest(attr, method_names)
        + " Rename it to match an event, or give helper methods a name without a "
        "pre_/post_/around_/error_/on_ prefix."
    )


def add_callback(target: Any, cb: Callback, /, **options: Any) -> Handle:
    """Register each event method of ``cb`` on one object (an instance of a hookable or
    woven class), a class (all its instances), a hookable function or a module (its
    hookable functions), each with the registration ``options`` (its own filter
    state); one handle removes them all."""
    where = f"add_callback({type(cb).__qualname__})"
    if not isinstance(cb, Callback):
        raise NotACallbackError(f"{where}: expected a hookwrap.Callback instance, got {type(cb).__qualname__}. "
                                f"Pass an instance of a hookwrap.Callback subclass (its event methods are "
                                f"registered), or register a function with hookwrap.before/after/around.")
    make_options(where, **options)  # a bad option fails before anything is registered
    registrations = _resolve_names(cb, _attach_target(target), where, options)
    if _attached_already(target, cb):
        raise HookError(f"{where}: this {type(cb).__qualname__} is attached to {safe_repr(target)} already: "
                        f"attached again, each of its methods would run twice a call (a notebook cell run "
                        f"twice does this). Remove it first (the handle add_callback returned: "
                        f"handle.remove()), or attach another one.")
    handle = register_entries(target, registrations, where)
    return settling(handle, cb, target)


def _attached_already(target: Any, cb: Callback) -> bool:
    """Is ``cb`` attached to ``target`` itself (its instance tier, its class's own
    registrations, the function)? A scan of that owner's registrations alone."""
    return any(getattr(entry.fn, "__self__", None) is cb for entry in registered_on(target))


def _attach_target(target: Any) -> Any:
    """What ``event_methods`` is asked about: the class for an instance or a class,
    else the hookable function or module itself."""
    if isinstance(target, (type, ModuleType)):
        return target
    jp = join_point_of(target)
    if jp is not None and jp.owner is None:
        return target
    return type(target)


def _resolve_names(cb: Callback, target: Any, where: str, options: dict[str, Any]) -> list[Registration]:
    jps = target_join_points(target)
    custom = declared_custom_events(target) if isinstance(target, type) else set()
    known = [f"{p}-{jp.event}" for jp in jps.values() for p in PHASES] + sorted(custom)
    registrations = []
    for event, method in _event_methods(cb, target, where):
        phase, name = parse_event(event, where)
        attr = event.replace("-", "_")  # the method name, for the default event_methods
        if phase == CUSTOM:
            if name not in custom:
                raise _unknown(cb, attr, known, where)
            registrations.append(Registration(name, method, _options_of(cb, where, method, **options), (phase, name)))
        else:
            jp = jps.get(normalize(name))
            if jp is None:
                raise _unknown(cb, attr, known, where)
            registrations.append(Registration(f"{phase}-{jp.event}", method, _options_of(cb, where, method, **options),
                                              (phase, jp.event)))
    return registrations


def _event_methods(cb: Callback, target: Any, where: str) -> list[tuple[Any, Any]]:
    """``cb.event_methods(target)``, checked: a list of ``(event string, callable)``."""
    label = f"{where}: {type(cb).__qualname__}.event_methods"
    if not callable(getattr(cb, "event_methods", None)):
        raise HookError(f"{label} is not a method; define `def event_methods(self, target)` returning "
                        f"(event, callable) pairs, or leave the one hookwrap.Callback has.")
    pairs = cb.event_methods(target)
    try:
        pairs = list(pairs)
    except TypeError:
        raise HookError(f"{label}() returned {safe_repr(pairs)}; it must return a list of "
                        f"(event, callable) pairs.") from None
    if isinstance(cb, Defers):  # where what it holds back is settled (hookwrap.extend.Defers)
        pairs = cb.with_boundaries(target, pairs)
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                and callable(pair[1])):
            raise HookError(f"{label}() returned {safe_repr(pair)} in its list; each item must be an "
                            f"(event, callable) pair like ('pre-step', self.pre_step).")
        made_for = getattr(pair[1], "__dict__", {}).get(READER_PHASE_ATTR)
        if made_for is not None and parse_event(pair[0], label)[0] != made_for:
            raise CallbackSignatureError(
                f"{label}() pairs event {pair[0]!r} with a reader made for {made_for}- events "
                f"({getattr(pair[1], '__qualname__', pair[1])}); make it for that event: "
                f"reader(handler, {pair[0]!r}, ...)."
            )
    return pairs


def _options_of(cb: Callback, where: str, method: Any, **options: Any) -> Options | None:
    """A registration's options for one of ``cb``'s methods (each its own filter state).
    A deferring callback's boundaries are not filtered by rank: they cost a gate on
    every call of their join points, and its ``settle`` knows its rank."""
    if cb.rank_zero_only and not (isinstance(cb, Defers) and is_boundary(method)):
        options["rank_zero_only"] = True
    return make_options(where, **options)


def _global_registration(event: Any, fn: Any, options: Options | None, where: str) -> Registration:
    return Registration(event, fn, options, parse_event(event, where))


def register_global_callback(cb: Any, **options: Any) -> Handle:
    """Register a ``Callback`` (each of its event methods) or an ``("event", fn)`` pair
    for every hookable object that has the event; returns a handle."""
    where = "register_global_callback"
    opts = make_options(where, **options)
    if isinstance(cb, Callback):
        registrations = []
        known_jps = {normalize(jp.event): jp for jp in all_join_points()}
        known = [f"{p}-{jp.event}" for jp in known_jps.values() for p in PHASES]
        for event, method in _event_methods(cb, None, where):
            registration = _global_registration(event, method, _options_of(cb, where, method, **options), where)
            if registration.phase != CUSTOM and registration.name not in known_jps:
                raise _unknown(cb, event.replace("-", "_"), known, f"{where}({type(cb).__qualname__})")
            registrations.append(registration)
        return settling(register_global(registrations, where), cb, None)
    if isinstance(cb, tuple) and len(cb) == 2:
        return register_global([_global_registration(cb[0], cb[1], opts, where)], where)
    raise NotACallbackError(
        f"{where}: expected a hookwrap.Callback instance or an ('event', fn) pair, got "
        f"{safe_repr(cb)} ({type(cb).__name__}) as the callback."
    )
