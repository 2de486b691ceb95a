"""The chain of an ``async def`` join point. Callbacks and around advice may be
sync or async; what an async one returns is awaited before the return contract
is applied. Shared by both dispatch implementations (it calls only their Step
methods and ``call_around``)."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from ._dispatch import call_around
from .errors import StopTraining, note_callback

__all__ = ["run_chain_async"]


async def _settle(step: Any, raw: Any) -> Any:
    if not inspect.isawaitable(raw):
        return raw
    try:
        return await raw
    except BaseException as exc:
        note_callback(exc, step.label, step.event)
        raise


async def _run_steps(steps: Any, obj: Any, args: list[Any], kwargs: dict[str, Any],
                     result: Any) -> Any:
    for step in steps:
        if step.gate is None or step.gate.admit(obj):
            raw = await _settle(step, step.invoke(obj, args, kwargs, result))
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
