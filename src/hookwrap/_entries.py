"""What a registration is: an entry (``Registration``: the event, the callback, its
options, the event's phase and join point name parsed once), the grammar of event
names, and the options checked when it is registered: filters (``every``,
``once``, ``when``, ``rank_zero_only``: a ``Gate``) and ordering (``prepend``,
``before=``, ``after=``: ``OrderGraph``, ``order_entries``).

Event names: a join point ``X`` has the events ``pre-X``, ``post-X``,
``around-X`` and ``error-X``. The phase is the exact prefix before the first
``-``, never a substring test (ArcticTraining treats ``post-predict`` as a pre
event because ``"pre" in`` it). Any other identifier, such as
``on_validation_end``, names a custom event, fired with ``emit`` and declared in
the class's ``emits``.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import threading
from typing import Any, Callable, Iterable, Sequence, cast

from .errors import HookError, UnknownEventError, add_note_once, closest, safe_repr

__all__ = [
    "CUSTOM",
    "Gate",
    "Options",
    "OrderGraph",
    "PHASES",
    "Registration",
    "callback_method_event",
    "callback_object_event",
    "make_options",
    "normalize",
    "order_entries",
    "parse_event",
    "process_group",
    "process_rank",
]


# --- Event names -----------------------------------------------------------------

PHASES = ("pre", "post", "around", "error")
CUSTOM = "on"  # the phase of a custom event

_CLASS_METHOD = re.compile(r"^(pre|post|around|error)_(.+)_callback$")
_OBJECT_METHOD = re.compile(r"^(pre|post|around|error)_(.+)$")


def normalize(name: str) -> str:
    """Join point names compare with ``-`` and ``_`` treated alike."""
    return name.replace("-", "_")


def parse_event(event: object, where: str, known: Iterable[str] = ()) -> tuple[str, str]:
    """``"pre-step"`` -> ``("pre", "step")``; ``"on_fit_end"`` -> ``("on", "on_fit_end")``.

    ``known`` (event strings) feeds the 'did you mean' of the error.
    """
    if not isinstance(event, str):
        raise UnknownEventError(
            f"{where}: an event must be a string like 'pre-step', 'post-step' or a custom "
            f"event name, got {safe_repr(event)} ({type(event).__name__})."
        )
    phase, sep, name = event.partition("-")
    if sep and phase in PHASES and name:
        return phase, name
    if not sep and event.isidentifier():
        return CUSTOM, event
    raise UnknownEventError(
        f"{where}: {safe_repr(event)} is not an event name. Events are '<phase>-<join point>' with a "
        f"phase of {', '.join(PHASES)} (e.g. 'pre-step'), or a custom event name."
        + closest(event, known)
    )


def callback_method_event(attr: str) -> tuple[str, str] | None:
    """A class-tier method name: ``"pre_step_callback"`` -> ``("pre", "step")``."""
    m = _CLASS_METHOD.match(attr)
    return (m.group(1), m.group(2)) if m else None


def callback_object_event(attr: str) -> tuple[str, str] | None:
    """A ``Callback`` method name: ``"pre_loss"`` -> ``("pre", "loss")``,
    ``"on_fit_end"`` -> ``("on", "on_fit_end")``; ``None`` if it names no event."""
    if attr.startswith("on_"):
        return CUSTOM, attr
    m = _OBJECT_METHOD.match(attr)
    return (m.group(1), m.group(2)) if m else None


# --- Options: filters and ordering -----------------------------------------------

def process_group() -> Any:
    """``torch.distributed`` when its default process group is initialised, else
    None: the one place hookwrap asks. Never imports torch (``import hookwrap``
    stays light): a process that has not imported it has no process group."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


# The rank asked of torch.distributed once per process group (the group it was asked
# of, and the answer), and RANK parsed once per value it takes.
_group_rank: tuple[Any, int] | None = None
_parsed_rank: tuple[Any, int] = (None, 0)
# CPython's os.environ keeps the variables in _data, keyed by encoded names: read there,
# a lookup is a dict's (os.environ.get encodes the name on every call: ~0.7 us).
_ENVIRON: dict[Any, Any] | None = getattr(os.environ, "_data", None)
_RANK_KEY: Any = getattr(os.environ, "encodekey", lambda name: name)("RANK")
_decode: Callable[[Any], str] = getattr(os.environ, "decodevalue", str)


def process_rank() -> tuple[int, bool]:
    """This process's rank, and whether it is final: torch.distributed's once its
    process group is initialised (``process_group``), asked once per group; before
    that, torchrun's ``RANK`` (else 0), read on each call (a launcher or a test may
    set it) and parsed once per value."""
    global _group_rank, _parsed_rank
    dist = process_group()
    if dist is not None:
        group = getattr(getattr(dist, "GroupMember", None), "WORLD", None)
        known = _group_rank
        if known is not None and group is not None and known[0] is group:
            return known[1], True
        rank = dist.get_rank()
        _group_rank = (group, rank) if group is not None else None
        return rank, True
    raw = _ENVIRON.get(_RANK_KEY) if _ENVIRON is not None else os.environ.get("RANK")
    parsed = _parsed_rank
    if raw == parsed[0]:
        return parsed[1], False
    text = (_decode(raw) if _ENVIRON is not None and raw is not None else raw) or "0"
    try:
        rank = int(text)
    except ValueError:
        raise HookError(
            f"RANK={text!r} in the environment is not a process rank: torchrun sets it to a whole "
            f"number. Unset it, or set it to this process's rank."
        ) from None
    _parsed_rank = (raw, rank)
    return rank, False


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
    """Does an ordering reference (a function, a Callback, a name) name ``fn``? The
    definition: ``OrderGraph`` answers it for every reference at once through the
    indexes of ``_match_keys``, never pair by pair."""
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


def _match_keys(fn: Any) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[int, ...]]:
    """What ordering references name ``fn`` (``_matches``, turned around): the objects
    a reference may be (``fn``, its ``__self__`` and that one's class, its
    ``__func__``: kept, so that their ids stay theirs), the names a string
    reference may be, and those objects' ids. ``_matches(ref, fn)`` holds exactly
    when ``id(ref)`` is one of the ids, or ``ref`` is a string among the names."""
    owner = getattr(fn, "__self__", None)
    func = getattr(fn, "__func__", None)
    names = [getattr(fn, "__name__", None), getattr(fn, "__qualname__", None)]
    if owner is None:
        objects: tuple[Any, ...] = (fn, func)
    else:
        objects = (fn, owner, type(owner), func)
        names.append(type(owner).__name__)
    return objects, tuple(dict.fromkeys(n for n in names if n is not None and _hashable(n))), \
        tuple(dict.fromkeys(map(id, objects)))


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:  # a name no string reference can equal in a set of names
        return False
    return True


class OrderGraph:
    """The ``before=``/``after=`` graph of a list of entries, built one entry at a time.

    Each entry is a node (numbered in the order added); an edge ``u -> v`` says
    ``u`` runs before ``v``: ``v`` is named by a ``before=`` reference of ``u``, or
    ``u`` by an ``after=`` reference of ``v`` (never an entry by its own). Adding an
    entry costs its own references and the references naming it, through indexes
    by object identity and by name, not a match of every reference against every
    entry. ``add`` also says whether the graph stayed acyclic (it was before):
    only a cycle through the new entry is looked for, and only when something
    runs both before and after it.

    Registration keeps one per owner and event (``_registry``), so that a
    registration is checked in time proportional to what it names, not to how
    many callbacks the event has; ``order_entries`` builds one for its edges.
    """

    __slots__ = ("token", "keep", "size", "by_id", "by_name", "refs_by_id", "refs_by_name", "succ", "pred")

    def __init__(self) -> None:
        self.token: Any = None  # what its owner's registrations were when it was last in step
        self.keep: list[Any] = []  # the entries and what their ids index: held, so ids stay unique
        self.size = 0
        self.by_id: dict[int, list[int]] = {}  # id of an object naming a node -> those nodes
        self.by_name: dict[Any, list[int]] = {}  # a name naming a node -> those nodes
        self.refs_by_id: dict[int, list[tuple[int, bool]]] = {}  # id of a reference -> (node, before?)
        self.refs_by_name: dict[Any, list[tuple[int, bool]]] = {}  # a string reference -> the same
        self.succ: dict[int, set[int]] = {}  # node -> what runs after it
        self.pred: dict[int, set[int]] = {}  # node -> what runs before it

    def _named(self, ref: Any) -> list[int]:
        found = self.by_id.get(id(ref), [])
        if isinstance(ref, str):
            by_name = self.by_name.get(ref)
            if by_name:
                found = found + by_name
        return found

    def _edge(self, u: int, v: int) -> None:
        succ = self.succ.get(u)
        if succ is None:
            succ = self.succ[u] = set()
        succ.add(v)
        pred = self.pred.get(v)
        if pred is None:
            pred = self.pred[v] = set()
        pred.add(u)

    def add(self, entry: Any, fn: Any, check: bool = True) -> bool:
        """Add ``entry`` (its callback ``fn``); False if it closes a cycle (looked
        for only if ``check``)."""
        v = self.size
        self.size = v + 1
        objects, names, ids = _match_keys(fn)
        options = options_of(entry)
        self.keep.append((entry, objects, options))
        edge = self._edge
        # References of earlier entries that name this one.
        refs_by_id, refs_by_name = self.refs_by_id, self.refs_by_name
        for keys, referring in ((ids, refs_by_id), (names, refs_by_name)):
            for key in keys:
                for u, before in referring.get(key, ()):
                    if before:
                        edge(u, v)
                    else:
                        edge(v, u)
        # This one, under each identity and name a reference may give it.
        for keys, index in ((ids, self.by_id), (names, self.by_name)):
            for key in keys:
                nodes = index.get(key)
                if nodes is None:
                    index[key] = [v]
                else:
                    nodes.append(v)
        # Its own references, to every entry they name (earlier ones; later ones find them).
        if options is not None and (options.before or options.after):
            for refs, before in ((options.before, True), (options.after, False)):
                for ref in refs:
                    for u in self._named(ref):
                        if u != v:
                            if before:
                                edge(v, u)
                            else:
                                edge(u, v)
                    refs_by_id.setdefault(id(ref), []).append((v, before))
                    if isinstance(ref, str):
                        refs_by_name.setdefault(ref, []).append((v, before))
        if not check or v not in self.succ or v not in self.pred:
            return True  # nothing runs both before and after it: no cycle through it
        # Does anything after it lead back to it?
        succ = self.succ
        seen = {v}
        stack = list(succ[v])
        while stack:
            u = stack.pop()
            if u == v:
                return False
            if u in seen:
                continue
            seen.add(u)
            stack.extend(succ.get(u, ()))
        return True


def order_entries(entries: Sequence[Any], fn_of: Callable[[Any], Any] = lambda e: e[1]) -> list[Any]:
    """Registration order; ``prepend=True`` ones first (the latest first); then
    ``before=``/``after=``: each entry pulls what must precede it forward, and
    everything else keeps its place. A cycle raises HookError naming it.

    Linear without ordering references (prepend alone); with them, linear in the
    entries and the constraints between them (``OrderGraph`` finds what each
    reference names by identity or name), and the placing walks without
    recursion, so a long chain of ``before=`` neither takes quadratic time nor
    overflows the stack."""
    if not any(options_of(e) is not None for e in entries):
        return list(entries)
    prepended = [e for e in entries if (options_of(e) and options_of(e).prepend)]  # type: ignore[union-attr]
    prepended_ids = {id(e) for e in prepended}
    base = prepended[::-1] + [e for e in entries if id(e) not in prepended_ids]
    if not any(opts.before or opts.after for opts in map(options_of, base) if opts is not None):
        return base
    n = len(base)
    fns = [fn_of(e) for e in base]
    graph = OrderGraph()
    for entry, fn in zip(base, fns):
        graph.add(entry, fn, check=False)
    no_pred: set[int] = set()
    pred = [graph.pred.get(i, no_pred) for i in range(n)]  # pred[j]: what must run before j
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
