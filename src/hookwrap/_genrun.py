"""The chain of a generator join point (``def`` with ``yield``, or ``async def``
with ``yield``): its call runs while the generator runs. Calling the join point
returns a generator; when it is first advanced, the pre callbacks run and the
function is called (through around advice, which gets and returns the
generator); its items pass through; when it is exhausted, the post callbacks run
(``return_value``: what the generator returned); an exception raised while it
runs reaches the error callbacks. A generator closed early ends without post
callbacks, as a call that did not finish. Shared by both dispatch
implementations (it calls only their Step methods and ``call_around``)."""

from __future__ import annotations

from typing import Any, AsyncGenerator, Callable, Generator

from ._asyncrun import call_around_async, run_steps_async
from ._dispatch import call_around
from ._policy import run_steps
from .errors import StopTraining

__all__ = ["run_chain_async_generator", "run_chain_generator"]

_EXHAUSTED = object()


def _call(chain: Any, func: Callable[..., Any], obj: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if chain.around:
        return call_around(chain.around, 0, func, obj,
                           tuple(args[1:] if chain.around[0].pass_obj else args), kwargs)
    return func(*args, **kwargs)


def run_chain_generator(chain: Any, func: Callable[..., Any], obj: Any, args: list[Any],
                        kwargs: dict[str, Any]) -> Generator[Any, Any, Any]:
    try:
        run_steps(chain.pre, obj, args, kwargs, None)
        returned = yield from _call(chain, func, obj, args, kwargs)  # send() and throw() reach it
        return run_steps(chain.post, obj, args, kwargs, returned)
    except Exception as exc:
        if chain.error and not isinstance(exc, StopTraining):
            run_steps(chain.error, obj, args, kwargs, exc)
        raise


async def run_chain_async_generator(chain: Any, func: Callable[..., Any], obj: Any, args: list[Any],
                                    kwargs: dict[str, Any]) -> AsyncGenerator[Any, Any]:
    try:
        await run_steps_async(chain.pre, obj, args, kwargs, None)
        if chain.around:  # advice may be async: `agen = await proceed(...)`
            inner = await call_around_async(chain.around, 0, func, obj,
                                            tuple(args[1:] if chain.around[0].pass_obj else args), kwargs)
        else:
            inner = func(*args, **kwargs)
        # `yield from inner`, which async generators lack (PEP 525), as PEP 380 expands
        # it: each item, value sent, exception thrown and the close reach `inner`.
        try:
            item = await inner.__anext__()
        except StopAsyncIteration:
            item = _EXHAUSTED
        while item is not _EXHAUSTED:
            try:
                sent = yield item
            except GeneratorExit:
                await inner.aclose()  # the wrapped generator's `finally` runs
                raise
            except BaseException as exc:
                step = inner.athrow(exc)
            else:
                step = inner.__anext__() if sent is None else inner.asend(sent)
            try:
                item = await step
            except StopAsyncIteration:
                item = _EXHAUSTED
        await run_steps_async(chain.post, obj, args, kwargs, None)
    except Exception as exc:
        if chain.error and not isinstance(exc, StopTraining):
            await run_steps_async(chain.error, obj, args, kwargs, exc)
        raise
