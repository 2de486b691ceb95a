"""The chain of an ``async def`` join point. Callbacks and around advice may be
sync or async; what an async one returns is awaited before the return contract
is applied. Shared by both dispatch implementations (it calls only their Step
methods and ``call_around``)."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from ._dispatch import call_around
from .errors import StopTraining, callback_note

__all__ = ["run_chain_async"]


def _stop_iteration(step: Any) -> RuntimeError:
    # A coroutine cannot pass StopIteration on (PEP 479): Python turns it into a
    # bare "coroutine raised StopIteration". Say whose it was instead.
    return RuntimeError(
        f"callback {step.label} raised StopIteration during event {step.event!r} of an async "
        f"join point, which a coroutine cannot pass on (PEP 479). Raise another exception to "
        f"end the call, or hookwrap.StopTraining to end a run."
    )


async def _settle(step: Any, raw: Any) -> Any:
    if not inspect.isawaitable(raw):
        return raw
    try:
        return await raw
    except RuntimeError as exc:
        if isinstance(exc.__cause__, StopIteration) and str(exc).endswith("raised StopIteration"):
            raise _stop_iteration(step) from exc.__cause__
        exc.add_note(callback_note(step.label, step.event))
        raise
    except BaseException as exc:
        exc.add_note(callback_note(step.label, step.event))
        raise


async def _run_steps(steps: Any, obj: Any, args: list[Any], kwargs: dict[str, Any],
                     result: Any) -> Any:
    for step in steps:
        if step.gate is None or step.gate.admit(obj):
            try:
                raw = await _settle(step, step.invoke(obj, args, kwargs, result))
            except StopIteration as exc:
                raise _stop_iteration(step) from exc
            result = step.absorb(obj, args, kwargs, raw, result)
    return result


async def run_chain_async(chain: Any, func: Callable[..., Any], obj: Any,
                          args: list[Any], kwargs: dict[str, Any]) -> Any:
    try:
        await _run_steps(chain.pre, obj, args, kwargs, None)
        if chain.around:
            result = call_around(chain.around, 0, func, obj,
                                 tuple(args[1:] if chain.around[0].pass_obj else args), kwargs)
        else:
            result = func(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return await _run_steps(chain.post, obj, args, kwargs, result)
    except Exception as exc:
        if chain.error and not isinstance(exc, StopTraining):
            await _run_steps(chain.error, obj, args, kwargs, exc)
        raise


run_steps_async = _run_steps  # the steps of one phase, for genrun's async generators
