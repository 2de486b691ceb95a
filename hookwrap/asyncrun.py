"""The chain of an ``async def`` join point. Callbacks may be sync or async;
what an async one returns is awaited before the return contract is applied.
Shared by both dispatch implementations (it calls only their Step methods)."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from .errors import callback_note

__all__ = ["run_chain_async"]


async def _settle(step: Any, raw: Any) -> Any:
    if not inspect.isawaitable(raw):
        return raw
    try:
        return await raw
    except BaseException as exc:
        exc.add_note(callback_note(step))
        raise


async def run_chain_async(chain: Any, func: Callable[..., Any], obj: Any,
                          args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call_args, call_kwargs = list(args), dict(kwargs)
    for step in chain.pre:
        raw = await _settle(step, step.invoke(obj, call_args, call_kwargs, None))
        step.absorb(obj, call_args, call_kwargs, raw, None)
    result = await func(*call_args, **call_kwargs)
    for step in chain.post:
        raw = await _settle(step, step.invoke(obj, call_args, call_kwargs, result))
        result = step.absorb(obj, call_args, call_kwargs, raw, result)
    return result
