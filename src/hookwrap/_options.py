"""Registration options: filters (``every``, ``once``, ``when``, ``rank_zero_only``)
and ordering (``prepend``, ``before=``, ``after=``), all checked when a callback is
registered."""

from __future__ import annotations

import inspect
import os
import sys
import threading
from typing import Any, Callable, Sequence, cast

from .errors import HookError, add_note_once, closest, safe_repr
from ._events import CUSTOM, normalize, parse_event

__all__ = ["Gate", "Options", "Registration", "make_options", "order_entries", "process_rank"]


def process_rank() -> tuple[int, bool]:
    """This process's rank, and whether it is final: torch.distributed's once its
    process group is initialised; before that, torchrun's ``RANK`` (else 0). Never
    imports torch (``import hookwrap`` stays light)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), True
    raw = os.environ.get("RANK") or "0"
    try:
        return int(raw), False
    except ValueError:
        raise HookError(
            f"RANK={raw!r} in the environment is not a process rank: torchrun sets it to a whole "
            f"number. Unset it, or set it to this process's rank."
        ) from None


_once_lock = threading.RLock()  # once=True gates decide under it (RLock: `when` may re-enter)


class Gate:
    """A filter on one registration; ``admit(obj)`` is asked on each call of its event.

    A call counts only when ``when(obj)`` is true (or there is no ``when``); the
    callback fires on counted calls N, 2N, ... for ``every=N``, and only on the
    first of them for ``once=True``. With ``rank_zero_only``, it fires only in the
    process of rank 0 (torch.distributed): elsewhere nothing counts.
    """

    __slots__ = ("every", "once", "when", "rank_zero_only", "count", "spent", "rank", "every_only", "label")

    def __init__(self, every: int | None, once: bool, when: Callable[[Any], Any] | None,
                 rank_zero_only: bool = False) -> None:
        self.every = every
        self.once = once
        self.when = when
        self.rank_zero_only = rank_zero_only
        self.count = 0
        self.spent = False
        self.rank: int | None = None  # kept once the process group says it
        self.every_only = self._every_only()
        self.label: str | None = None  # the callback it filters, for notes (set when planned)

    def _every_only(self) -> bool:
        """``every=N`` and nothing else: admit() counts and tests, no other checks."""
        return self.every is not None and not (self.once or self.rank_zero_only) and self.when is None

    def admit(self, obj: Any) -> bool:
        if self.every_only:  # the common filter: one counter, one modulo
            count = self.count = self.count + 1
            return not count % self.every  # type: ignore[operator]
        if self.spent:
            return False
        if self.once:  # check and spend under one lock: two threads never both fire it
            with _once_lock:
                return not self.spent and self._admit(obj)
        return self._admit(obj)

    def _admit(self, obj: Any) -> bool:
        if self.rank_zero_only:
            rank = self.rank
            if rank is None:
                rank, final = process_rank()
                if final:
                    self.rank = rank
            if rank != 0:
                return False
        if self.when is not None:
            try:
                admitted = self.when(obj)
            except Exception as exc:
                add_note_once(exc, f"hookwrap: raised in the when= predicate of callback {self.label}")
                raise
            if not admitted:
                return False
        self.count += 1
        if self.every is not None and self.count % self.every:
            return False
        if self.once:
            self.spent = True
        return True

    def __getstate__(self) -> Any:
        # A loaded gate finds its rank again: it may be loaded in another process.
        return (self.every, self.once, self.when, self.rank_zero_only, self.count, self.spent)

    def __setstate__(self, state: Any) -> None:
        self.every, self.once, self.when, self.rank_zero_only, self.count, self.spent = state
        self.rank = None
        self.label = None
        self.every_only = self._every_only()

    def __repr__(self) -> str:
        parts = []
        if self.every is not None:
            parts.append(f"every={self.every}")
        if self.once:
            parts.append("once=True")
        if self.when is not None:
            parts.append(f"when={getattr(self.when, '__name__', self.when)!r}")
        if self.rank_zero_only:
            parts.append("rank_zero_only=True")
        return ", ".join(parts)


class Options:
    __slots__ = ("prepend", "before", "after", "gate")

    def __init__(self, prepend: bool, before: tuple[Any, ...], after: tuple[Any, ...],
                 gate: Gate | None) -> None:
        self.prepend = prepend
        self.before = before
        self.after = after
        self.gate = gate

    def __getstate__(self) -> Any:
        return (self.prepend, self.before, self.after, self.gate)

    def __setstate__(self, state: Any) -> None:
        self.prepend, self.before, self.after, self.gate = state


OPTION_NAMES = ("prepend", "before", "after", "every", "once", "when", "rank_zero_only")


def make_options(where: str, *, prepend: bool = False, before: Any = (), after: Any = (),
                 every: int | None = None, once: bool = False,
                 when: Callable[[Any], Any] | None = None,
                 rank_zero_only: bool = False, **unknown: Any) -> Options | None:
    """Check registration options; ``None`` when all are at their defaults."""
    for name in unknown:
        raise HookError(
            f"{where}: {name}= is not a registration option." + closest(name, OPTION_NAMES)
            + f" Options: {', '.join(OPTION_NAMES)}."
        )
    if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
        raise HookError(f"{where}: every={safe_repr(every)} must be a whole number >= 1 (fire on calls N, 2N, ...).")
    if when is not None and not callable(when):
        raise HookError(f"{where}: when={safe_repr(when)} must be a predicate taking the hooked object.")
    if when is not None and inspect.iscoroutinefunction(getattr(when, "__func__", when)):
        raise HookError(f"{where}: when={getattr(when, '__qualname__', when)} is an async def: its "
                        f"coroutine would always read as true. Make it a plain def.")
    if when is not None:
        _check_when_arity(when, where)
    for name, flag in (("prepend", prepend), ("once", once), ("rank_zero_only", rank_zero_only)):
        if not isinstance(flag, bool):  # "no" would read as true
            raise HookError(f"{where}: {name}={safe_repr(flag)} must be True or False.")
    before_t, after_t = _refs(before, "before", where), _refs(after, "after", where)
    filtered = every is not None or once or when is not None or rank_zero_only
    gate = Gate(every, bool(once), when, rank_zero_only) if filtered else None
    if not (prepend or before_t or after_t or gate):
        return None
    return Options(bool(prepend), before_t, after_t, gate)


def _check_when_arity(when: Callable[[Any], Any], where: str) -> None:
    """``when(obj)`` is called with one argument, the hooked object: a predicate that
    cannot take it is refused now, not at the first call (when it can tell)."""
    try:
        signature = inspect.signature(when)
    except (TypeError, ValueError):  # a builtin or an object that hides it: trust it
        return
    try:
        signature.bind(None)
    except TypeError:
        label = getattr(when, "__qualname__", None) or type(when).__name__
        raise HookError(
            f"{where}: when={label}{signature} cannot be called with the one argument it is "
            f"given, the hooked object (None for a plain function). Define it as "
            f"`def when(obj): ...` (returning whether the callback runs)."
        ) from None


def _refs(value: Any, name: str, where: str) -> tuple[Any, ...]:
    """An ordering option's references: callbacks, the objects whose methods they
    are (a Callback, a reader's owner), their classes, or their names."""
    if value is None:
        return ()
    refs = tuple(value) if isinstance(value, (list, tuple, set, frozenset)) else (value,)
    for ref in refs:
        if ref is None or isinstance(ref, (bool, int, float, complex, bytes)):
            raise HookError(
                f"{where}: {name}={safe_repr(ref)} names no callback. Give the callback itself, its "
                f"name, or a Callback object or class."
            )
    return refs


class Registration(tuple):  # type: ignore[type-arg]
    """An ``(event, fn)`` entry that also carries its options, its event parsed once
    (``phase``, and ``name``: normalized for a join point), and the steps planned
    from it (``steps``: join point spec -> Step, weakly keyed). It compares equal
    to the plain pair, so ``obj.callbacks`` reads as a list of pairs."""

    options: Options | None
    phase: str
    name: str
    steps: Any

    def __new__(cls, event: str, fn: Any, options: Options | None = None,
                parsed: tuple[str, str] | None = None) -> Registration:
        self = super().__new__(cls, (event, fn))
        self.options = options
        phase, name = parsed if parsed is not None else parse_event(event, "callback entry")
        self.phase = phase
        self.name = name if phase == CUSTOM else normalize(name)
        self.steps = None
        return self

    @property
    def event(self) -> str:
        """The event as written (``"pre-loss"``, ``"pre_loss"``, a custom name)."""
        return cast(str, self[0])

    @property
    def fn(self) -> Any:
        """The callback."""
        return self[1]

    def __reduce__(self) -> Any:
        return (Registration, (self.event, self.fn, self.options))


def options_of(entry: Any) -> Options | None:
    return getattr(entry, "options", None)


def _matches(ref: Any, fn: Any) -> bool:
    """Does an ordering reference (a function, a Callback, a name) name ``fn``?"""
    if ref is fn:
        return True
    owner = getattr(fn, "__self__", None)
    if owner is not None and (ref is owner or ref is type(owner)):
        return True
    if getattr(fn, "__func__", None) is ref:
        return True
    if isinstance(ref, str):
        names = {getattr(fn, "__name__", None), getattr(fn, "__qualname__", None)}
        if owner is not None:
            names.add(type(owner).__name__)
        return ref in names
    return False


def _label(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def order_entries(entries: Sequence[Any], fn_of: Callable[[Any], Any] = lambda e: e[1]) -> list[Any]:
    """Registration order; ``prepend=True`` ones first (the latest first); then
    ``before=``/``after=``: each entry pulls what must precede it forward, and
    everything else keeps its place. A cycle raises HookError naming it.

    Linear without ordering references (prepend alone); with them, each reference
    is matched once against every entry, and the placing walks without recursion,
    so a long chain of ``before=`` neither takes cubic time nor overflows the stack."""
    if not any(options_of(e) is not None for e in entries):
        return list(entries)
    prepended = [e for e in entries if (options_of(e) and options_of(e).prepend)]  # type: ignore[union-attr]
    prepended_ids = {id(e) for e in prepended}
    base = prepended[::-1] + [e for e in entries if id(e) not in prepended_ids]
    if not any(opts.before or opts.after for opts in map(options_of, base) if opts is not None):
        return base
    n = len(base)
    fns = [fn_of(e) for e in base]
    pred: list[set[int]] = [set() for _ in range(n)]  # pred[j]: what must run before j
    for i, entry in enumerate(base):
        opts = options_of(entry)
        if opts is None or not (opts.before or opts.after):
            continue
        for j in range(n):
            if j == i:
                continue
            if any(_matches(ref, fns[j]) for ref in opts.before):
                pred[j].add(i)
            if any(_matches(ref, fns[j]) for ref in opts.after):
                pred[i].add(j)
    # Depth first, in base order: an entry pulls what must precede it forward,
    # and otherwise everything keeps its place. An explicit stack of (entry, what
    # of its predecessors is left to place).
    out: list[int] = []
    placed: set[int] = set()
    for start in range(n):
        if start in placed:
            continue
        path: list[int] = [start]
        on_path = {start}
        todo: list[list[int]] = [sorted(pred[start], reverse=True)]
        while path:
            if todo[-1]:
                k = todo[-1].pop()
                if k in placed:
                    continue
                if k in on_path:
                    cycle = path[path.index(k):] + [k]
                    names = " -> ".join(_label(fns[m]) for m in cycle[::-1])
                    raise HookError(
                        f"before=/after= constraints form a cycle: {names} (each runs before the "
                        f"next). Remove one of these constraints."
                    )
                path.append(k)
                on_path.add(k)
                todo.append(sorted(pred[k], reverse=True))
                continue
            done = path.pop()
            on_path.discard(done)
            todo.pop()
            placed.add(done)
            out.append(done)
    return [base[i] for i in out]
