"""Issue 32, item 3: ordering and registration in near-linear time, with the same
results as before. Counted, never timed: each registration indexes its own entry
once and runs no full ordering; the ordering itself is compared with the
quadratic algorithm it replaced on random constraint sets (orders, and cycle
errors word for word)."""

from __future__ import annotations

import random
import sys
from typing import Any, Callable, Sequence

import pytest


# --- the algorithm before issue 32, kept as the reference ------------------------


def old_matches(ref: Any, fn: Any) -> bool:
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


def old_order_entries(entries: Sequence[Any], HookError: type,
                      fn_of: Callable[[Any], Any] = lambda e: e[1]) -> list[Any]:
    def options_of(entry: Any) -> Any:
        return getattr(entry, "options", None)

    def label(fn: Any) -> str:
        return getattr(fn, "__qualname__", None) or repr(fn)

    if not any(options_of(e) is not None for e in entries):
        return list(entries)
    prepended = [e for e in entries if (options_of(e) and options_of(e).prepend)]
    prepended_ids = {id(e) for e in prepended}
    base = prepended[::-1] + [e for e in entries if id(e) not in prepended_ids]
    if not any(opts.before or opts.after for opts in map(options_of, base) if opts is not None):
        return base
    n = len(base)
    fns = [fn_of(e) for e in base]
    pred: list[set[int]] = [set() for _ in range(n)]
    for i, entry in enumerate(base):
        opts = options_of(entry)
        if opts is None or not (opts.before or opts.after):
            continue
        for j in range(n):
            if j == i:
                continue
            if any(old_matches(ref, fns[j]) for ref in opts.before):
                pred[j].add(i)
            if any(old_matches(ref, fns[j]) for ref in opts.after):
                pred[i].add(j)
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
                    names = " -> ".join(label(fns[m]) for m in cycle[::-1])
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


def outcome(order: Callable[[], list[Any]]) -> Any:
    """The ordered entries (by identity), or the message of the cycle raised."""
    try:
        return ("order", [id(e) for e in order()])
    except Exception as exc:  # noqa: BLE001 (the type is compared too)
        return ("raised", type(exc).__name__, str(exc))


# --- random callbacks and constraints -----------------------------------------------


def pool(hw: Any, rng: random.Random) -> list[Any]:
    """Callbacks of every kind a reference can name: plain functions (two sharing a
    name), bound methods of Callback objects of two classes (two objects of one)."""
    def function(name: str) -> Any:
        def cb(self: Any) -> None:
            pass
        cb.__name__ = name
        cb.__qualname__ = f"q.{name}"
        return cb

    class Logger(hw.Callback):
        def pre_step(self, trainer: Any) -> None:
            pass

    class Saver(hw.Callback):
        def pre_step(self, trainer: Any) -> None:
            pass

    fns = [function(n) for n in ("a", "b", "c", "d", "e", "a")]
    fns += [Logger().pre_step, Logger().pre_step, Saver().pre_step]
    rng.shuffle(fns)
    return fns


def some_reference(rng: random.Random, fn: Any) -> Any:
    """A reference that names ``fn``: itself, its name or qualified name, its
    object, its object's class or class name, its __func__; now and then a name
    of nothing."""
    owner = getattr(fn, "__self__", None)
    choices: list[Any] = [fn, fn.__name__, fn.__qualname__, "nothing"]
    if owner is not None:
        choices += [owner, type(owner), type(owner).__name__, fn.__func__]
    return rng.choice(choices)


def random_entries(hw: Any, rng: random.Random, acyclic: bool) -> list[Any]:
    """A list of Registrations with random prepend/before/after. ``acyclic``: every
    constraint follows one random rank, so only references naming several
    callbacks (a name, a class) can still close a cycle."""
    from hookwrap._entries import Registration, make_options

    fns = pool(hw, rng)
    n = rng.randint(1, 14)
    chosen = [rng.choice(fns) for _ in range(n)]
    rank = {id(fn): i for i, fn in enumerate(rng.sample(fns, len(fns)))}
    entries = []
    for fn in chosen:
        before, after = [], []
        for _ in range(rng.choice((0, 0, 1, 1, 2, 3))):
            other = rng.choice(chosen)
            if acyclic and rank[id(other)] == rank[id(fn)]:
                continue
            ref = some_reference(rng, other)
            if acyclic:
                (before if rank[id(fn)] < rank[id(other)] else after).append(ref)
            else:
                rng.choice((before, after)).append(ref)
        before = [r for r in before if r is not fn]
        after = [r for r in after if r is not fn]
        options = make_options("test", prepend=rng.random() < 0.2, before=before, after=after)
        entries.append(Registration("pre-step", fn, options))
    return entries


@pytest.mark.parametrize("acyclic", [True, False], ids=["dags", "any"])
def test_order_entries_matches_the_algorithm_it_replaced(hw, acyclic):
    from hookwrap._entries import order_entries

    rng = random.Random(32 + acyclic)
    raised = 0
    for _ in range(300):
        entries = random_entries(hw, rng, acyclic)
        expected = outcome(lambda: old_order_entries(entries, hw.HookError))
        assert outcome(lambda: order_entries(entries)) == expected
        raised += expected[0] == "raised"
    assert 0 < raised < 300  # both outcomes were compared


def test_registration_checks_and_orders_as_the_algorithm_it_replaced(hw):
    """Random registrations on an instance, its class and the global tier, with
    removals and direct changes of obj.callbacks between them: each is refused
    exactly when the old check raised (the same message), and each call runs the
    callbacks in the old order."""
    from hookwrap._entries import Registration, make_options

    rng = random.Random(3200)
    refused = stored = 0
    for round_ in range(60):
        class Trainer(hw.Hookable):
            @hw.hookable
            def step(self):
                pass

        t = Trainer()
        tier = rng.choice(("instance", "class", "global"))
        fns = pool(hw, rng)
        live: list[tuple[Any, Any]] = []  # (registration-like entry, handle)
        handles: list[Any] = []
        for _ in range(rng.randint(1, 16)):
            fn = rng.choice(fns)
            opts: dict[str, Any] = {}
            if rng.random() < 0.2:
                opts["prepend"] = True
            for side in ("before", "after"):
                if rng.random() < 0.4:
                    ref = some_reference(rng, rng.choice(fns))
                    if ref is not fn:
                        opts[side] = ref
            probe = Registration("pre-step", fn, make_options("test", **opts))
            expected = outcome(lambda: old_order_entries([e for e, _ in live] + [probe], hw.HookError))
            try:
                if tier == "instance":
                    handle = t.before("step", fn, **opts)
                elif tier == "class":
                    handle = hw.before(Trainer, "step", fn, **opts)
                else:
                    handle = hw.register_global_callback(("pre-step", fn), **opts)
            except hw.HookError as exc:
                assert expected == ("raised", "HookError", str(exc))
                refused += 1
                continue
            assert expected[0] == "order"
            stored += 1
            handles.append(handle)
            live.append((probe, handle))
            r = rng.random()
            if r < 0.15 and live:  # a removal
                i = rng.randrange(len(live))
                live[i][1].remove()
                del live[i]
            elif r < 0.25 and tier == "instance" and live:  # obj.callbacks changed directly
                i = rng.randrange(len(live))
                del t.callbacks[i]
                del live[i]
            if rng.random() < 0.3:  # a call orders the chain in between
                t.step()
                assert calls_of(t) == [e[1] for e in old_order_entries([e for e, _ in live], hw.HookError)]
        try:
            t.step()
            assert calls_of(t) == [e[1] for e in old_order_entries([e for e, _ in live], hw.HookError)], round_
        finally:
            for handle in handles:
                handle.remove()
    assert refused > 10 and stored > 100  # both outcomes were compared


def calls_of(t: Any) -> list[Any]:
    """The callbacks a call of t.step() runs before it, in order."""
    return [entry.fn for entry in _running(t)]


def _running(t: Any) -> list[Any]:
    from hookwrap._registry import entries_for
    from hookwrap._registry import instance_state

    state = instance_state(t, create=False)
    jp = type(t).__dict__["step"]
    from hookwrap._joinpoints import join_point_of

    return [e for e in entries_for("step", False, type(t), join_point_of(jp), state)
            if e.phase == "pre"]


# --- the algorithmic property, counted ----------------------------------------------


def numbered(i: int) -> Any:
    def cb(self: Any) -> None:
        pass
    cb.__name__ = cb.__qualname__ = f"cb{i}"
    return cb


@pytest.mark.parametrize("tier", ["instance", "class", "global"])
@pytest.mark.parametrize("shape", ["before", "after", "prepend", "plain", "by name"])
def test_each_registration_indexes_only_itself(hw, monkeypatch, tier, shape):
    """Registering N callbacks with ordering options indexes each entry once
    (``_match_keys``, once per entry), looks for a cycle through no other entry,
    and runs no full ordering (``order_entries``, which took time quadratic in
    the entries, and ran at every registration: cubic in all). The first call
    orders the chain once: one more index per entry."""
    options = sys.modules["hookwrap._entries"]
    registration = sys.modules["hookwrap._registry"]
    indexed: list[Any] = []
    ordered: list[int] = []
    searched: list[int] = []
    real_keys, real_order, real_add = options._match_keys, registration.order_entries, options.OrderGraph.add
    monkeypatch.setattr(options, "_match_keys", lambda fn: indexed.append(fn) or real_keys(fn))
    monkeypatch.setattr(registration, "order_entries", lambda *a: ordered.append(1) or real_order(*a))

    def add(graph: Any, entry: Any, fn: Any, check: bool = True) -> bool:
        fits = real_add(graph, entry, fn, check)
        v = graph.size - 1  # a search for a cycle walks from it only if it has both
        searched.append(int(check and v in graph.succ and v in graph.pred))
        return fits

    monkeypatch.setattr(options.OrderGraph, "add", add)

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self):
            pass

    t = Trainer()
    n = 400
    fns = [numbered(i) for i in range(n)]
    handles = []
    for i, fn in enumerate(fns):
        opts: dict[str, Any] = {}
        if i and shape == "before":
            opts["before"] = fns[i - 1]
        elif i and shape == "after":
            opts["after"] = fns[i - 1]
        elif i and shape == "by name":
            opts["before"] = f"cb{i - 1}"
        elif shape == "prepend":
            opts["prepend"] = True
        if tier == "instance":
            handles.append(t.before("step", fn, **opts))
        elif tier == "class":
            handles.append(hw.before(Trainer, "step", fn, **opts))
        else:
            handles.append(hw.register_global_callback(("pre-step", fn), **opts))
    try:
        assert len(indexed) == n and {id(f) for f in indexed} == {id(f) for f in fns}
        assert ordered == []
        assert sum(searched) == 0
        indexed.clear()
        assert [e.fn for e in _running(t)] == (fns if shape in ("plain", "after") else fns[::-1])
        assert len(indexed) == (0 if shape in ("plain", "prepend") else n)
    finally:
        for handle in handles:
            handle.remove()


def test_a_cycle_found_by_the_graph_is_named_as_before(hw):
    """A cycle closed by a late registration, through a long chain: refused with the
    message the full ordering gives, and the graph kept for the next registration
    is the one without it."""
    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self):
            pass

    from hookwrap._entries import Registration, make_options

    t = Trainer()
    fns = [numbered(i) for i in range(50)]
    t.before("step", fns[0])
    for i in range(1, 50):
        t.before("step", fns[i], before=fns[i - 1])
    late = numbered(99)
    probe = Registration("pre-step", late, make_options("test", before=fns[49], after="cb0"))
    expected = outcome(lambda: old_order_entries(list(t.callbacks) + [probe], hw.HookError))
    assert expected[0] == "raised" and "cb99" in expected[2]
    with pytest.raises(hw.HookError) as raised:
        t.before("step", late, before=fns[49], after="cb0")
    assert ("raised", "HookError", str(raised.value)) == expected
    assert len(t.callbacks) == 50
    extra = numbered(50)
    t.before("step", extra, after=fns[0])
    assert [e.fn for e in _running(t)] == fns[::-1] + [extra]


def test_a_subclass_changed_late_is_refused_at_a_base_registration_with_its_graph_kept(hw):
    """A registration on a base checks each subclass's class tier, which refuses a
    callback method assigned after the subclass was created: still so when that
    subclass's graph is kept from an earlier registration (and no class_entries
    is read for it)."""
    class T(hw.Hookable):
        @hw.hookable
        def step(self):
            pass

    class S(T):
        pass

    first = hw.before(T, "step", numbered(0))
    try:
        S.pre_step_callback = numbered(1)
        with pytest.raises(hw.HookError, match=r"S\.pre_step_callback was assigned or deleted after the class"):
            hw.before(T, "step", numbered(2), before="cb0")
        del S.pre_step_callback
        hw.before(T, "step", numbered(3), before="cb0").remove()
    finally:
        first.remove()
