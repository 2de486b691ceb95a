"""A join point whose callbacks run inside a guard (``hookwrap.extend.guard``).

The dispatch calls a join point's ``run_wrapped`` only when callbacks are to run
(the chain is not empty); with none it calls the function itself, at the cost of
the dispatch alone. A preset uses that: what it adds around a framework's stage
(catch ``StopTraining`` and stop the framework's way, refuse a change the
framework would never see) is only needed when a callback runs, so it goes there,
and a stage nobody listens to costs what a join point costs. The chain runs as
every path runs it (``_policy.run_steps``, ``call_around``), in both twins."""

from __future__ import annotations

from typing import Any, Callable

from ._dispatch import call_around
from ._policy import run_steps
from .errors import StopTraining

__all__ = ["guarded_runner", "is_guarded", "run_chain"]


def run_chain(chain: Any, func: Callable[..., Any], obj: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The chain's callbacks around ``func(*args, **kwargs)``: pre, around, the call,
    post; error callbacks on an exception (not on a StopTraining)."""
    try:
        run_steps(chain.pre, obj, args, kwargs, None)
        if chain.around:
            result = call_around(chain.around, 0, func, obj,
                                 tuple(args[1:] if chain.around[0].pass_obj else args), kwargs)
        else:
            result = func(*args, **kwargs)
        return run_steps(chain.post, obj, args, kwargs, result)
    except Exception as exc:
        if chain.error and not isinstance(exc, StopTraining):
            run_steps(chain.error, obj, args, kwargs, exc)
        raise


def guarded_runner(guard: Callable[..., Any]) -> Callable[..., Any]:
    """A join point's ``run_wrapped``: ``guard(run, func, obj, args, kwargs)``, where
    ``run(f)`` runs the call's callbacks around ``f`` in place of ``func``."""

    def run_guarded(chain: Any, func: Callable[..., Any], obj: Any, args: list[Any],
                    kwargs: dict[str, Any]) -> Any:
        return guard(lambda f: run_chain(chain, f, obj, args, kwargs), func, obj, args, kwargs)

    run_guarded.guarded = True  # type: ignore[attr-defined]
    return run_guarded


def is_guarded(jp: Any) -> bool:
    """Does ``jp`` run its chain in a guard (its call runs it, as a plain function's)?"""
    return getattr(jp.run_wrapped, "guarded", False)
