"""torch.compile and the compiled dispatch: what Dynamo traces in its place.

Dynamo traces Python bytecode. The pure twin is Python throughout: a class holds
its dispatch function, and Dynamo traces through it. The compiled ``JoinPoint``
is C, which Dynamo can neither bind nor call: it would read ``obj.step`` as the
bare join point and call it without ``obj``, and ``torch.compile(module)`` stops
before running when ``forward`` is one (it asks for the method's source file).

So the compiled twin shows Dynamo Python twins of its C slots
(``_fast.show_python_twins``): ``JoinPoint.__get__`` and ``JoinPoint.__call__``
in the type's dictionary are ``dynamo_get`` and ``dynamo_call`` below, while
every real call still takes the C slots. They run ``traced_dispatch``: the
pure twin's ``_dispatch`` over the compiled twin's chains, each with a pure copy
of its steps (``pure_chain``, made by ``Chain.traced`` on first use, which Dynamo
calls for real), so tensor-only callbacks land in the graph with no break.
Building a chain (locks, signatures, weak references) is never traced
(``_chains``): a chain missing at trace time is one graph break, and a
registration rebuilds at once the chains a trace read (``_owners.rebuild``).
The pure twin's dispatch functions name ``traced_dispatch`` as what Dynamo
inlines in their place (``_torchdynamo_inline``): it reads no hot cache.

An ``nn.Module``'s hookable ``forward`` is stored as a Python function calling
the join point (``module_attribute``), so that ``torch.compile(module)`` finds a
function where it looks for ``forward``'s source: one Python frame and a dict
read, about 0.15 us beside the ~0.8 us of ``nn.Module.__call__`` itself.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from . import _fast_py as pure
from ._dispatch import USING_EXTENSION, show_python_twins
from ._rules import CLASSMETHOD, FUNCTION, JOIN_POINT_ATTR, RECORD_ATTR

__all__ = [
    "drop_compiled_code", "dynamo_call", "dynamo_get", "install", "note_planned", "pure_chain",
    "traced_dispatch",
]

PLANS_ATTR = "__hookwrap_plans__"  # in a join point's __dict__: chains built for it


def note_planned(jp: Any) -> None:
    """A chain was built for ``jp`` (the planner, under its lock). A compiled frame
    that read the count recompiles when it changes: one whose trace met a chain
    not built yet (a graph break, the chain built eagerly after it) gets a trace
    with no break on its next call."""
    plans = jp.__dict__
    # A str: Dynamo guards a str's value always (an int it may make symbolic).
    plans[PLANS_ATTR] = str(int(plans.get(PLANS_ATTR, "0")) + 1)


def _is_torch_module_class(owner: Any) -> bool:
    torch = sys.modules.get("torch")  # not imported: nothing can be an nn.Module
    nn = getattr(torch, "nn", None)
    return nn is not None and isinstance(owner, type) and issubclass(owner, nn.Module)


def install(jp: Any, owner: Any, name: str) -> None:
    """Named in a class: as an nn.Module's ``forward``, store ``module_attribute(jp)``
    in place of the bare join point (compiled) or its dispatch function (pure)."""
    if name != "forward":  # the one method torch.compile(module) reads the source of
        return
    stored = owner.__dict__.get(name)
    if stored is not None and stored is _target(jp) and _is_torch_module_class(owner):
        type.__setattr__(owner, name, module_attribute(jp))


def _target(jp: Any) -> Any:
    """What calls ``jp`` at full speed: the compiled join point, or the pure twin's
    dispatch function (whose ``_torchdynamo_inline`` is ``traced_dispatch``)."""
    return jp if USING_EXTENSION else jp._dispatch


def module_attribute(jp: Any) -> Any:
    """A Python function calling ``jp``, sharing its ``__dict__`` as the pure twin's
    dispatch function does (``__wrapped__``, the registration verbs, the mark by
    which ``join_point_of`` finds it)."""

    plans = jp.__dict__
    target = _target(jp)

    def call(*args: Any, **kwargs: Any) -> Any:
        if plans.get(PLANS_ATTR) is None:  # a guard for Dynamo (note_planned)
            pass
        return target(*args, **kwargs)

    jp.__dict__[JOIN_POINT_ATTR] = jp
    pure._named_like(call, jp.func)
    call.__dict__ = jp.__dict__
    return call


def drop_compiled_code() -> None:
    """Methods were woven or restored: code torch.compile built before may have
    inlined the old ones, and Dynamo does not guard the classes of torch.nn (it
    would run the old method, callbacks and all, silently). Drop it all; what runs
    next compiles again."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


def pure_chain(chain: Any) -> Any:
    """The pure twin's copy of a compiled chain: the same callbacks, gates and
    argument plans, in objects Dynamo can trace."""

    def steps(compiled: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(
            pure.Step(s.fn, s.event, s.label, s.phase, s.pass_obj,
                      tuple(pure.ArgRef(r.kind, r.index, r.name, r.default, r.extra)
                            for r in s.refs),
                      s.kwnames, s.gate)
            for s in compiled)

    return pure.Chain(chain.tp, chain.fire, steps(chain.pre), steps(chain.post),
                      steps(chain.around), steps(chain.error), chain.check_state, chain.base)


def traced_dispatch(jp: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The compiled dispatch, written for Dynamo: the pure twin's ``_dispatch``,
    reading the compiled twin's chains without the planner's lock when they are
    built and valid (the planner, asked on a miss, runs eagerly: see _chains)."""
    binding = jp.binding
    if binding == FUNCTION:
        obj = None
        tp = jp.owner
        record = jp.record if tp is None else tp.__dict__.get(RECORD_ATTR)
    elif args:
        obj = args[0]
        tp = obj if binding == CLASSMETHOD else type(obj)
        record = tp.__dict__.get(RECORD_ATTR)
    else:  # a method called unbound without an object: let Python report it
        return jp.func(*args, **kwargs)
    chain = record.chains.get(jp) if record is not None else None
    if chain is None or not chain.valid or chain.tp is not tp:
        chain = jp.planner.type_chain(jp, tp)
    pure_steps = chain.traced  # read first: it marks the chain (compiled twin); see Chain
    if chain.passthrough:
        return jp.func(*args, **kwargs)
    if chain.check_state:
        # Read as the pure twin reads it, as an attribute (its class holds None):
        # Dynamo guards an attribute, where a read of `obj.__dict__` left compiled
        # code of one instance running for another that gained callbacks.
        own = pure._own_chain(jp, obj, chain, record is not None and record.own_getattribute)
        if own is not chain:
            chain = own
            pure_steps = chain.traced
    if chain.empty:
        return jp.func(*args, **kwargs)
    if jp.guard is not None:
        return pure._run_guarded(jp.guard, pure_steps, jp.func, obj, args, kwargs, traced=True)
    if jp.run_wrapped is not None:
        return jp.run_wrapped(chain, jp.func, obj, list(args), kwargs)
    return pure._run_owned(pure_steps, jp.func, obj, list(args), kwargs)


def _method(jp: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
    return traced_dispatch(jp, (obj, *args), kwargs)


def dynamo_get(self: Any, obj: Any, cls: Any = None) -> Any:
    """``JoinPoint.__get__`` as Dynamo sees it: a bound method it can trace."""
    if obj is None:
        return self
    if self.__dict__.get(PLANS_ATTR) is None:  # a guard: see note_planned
        pass
    return functools.partial(_method, self, obj)


def dynamo_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``JoinPoint.__call__`` as Dynamo sees it."""
    return traced_dispatch(self, args, kwargs)


def dynamo_emit_get(self: Any, obj: Any, cls: Any = None) -> Any:
    """``emit``'s ``__get__`` as Dynamo sees it: the pure twin's emit (which runs
    over the compiled twin's plans), bound."""
    if obj is None:
        return self
    return functools.partial(self.__wrapped__, obj)


def dynamo_emit_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``emit``'s ``__call__`` as Dynamo sees it."""
    return self.__wrapped__(*args, **kwargs)


if USING_EXTENSION:
    show_python_twins(dynamo_get, dynamo_call, pure_chain, dynamo_emit_get, dynamo_emit_call)
