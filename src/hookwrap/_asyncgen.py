"""The chains of ``async def`` and generator join points: the rules of a call
(``_rules``) adapted to ``await`` and to a call that lasts while its generator runs.

An ``async def`` join point: callbacks and around advice may be sync or async;
what an async one returns is awaited before the return contract (``absorb``) is
applied, and around advice gets a ``_rules.Proceed`` that returns a coroutine.

A generator join point (``def`` with ``yield``, or ``async def`` with ``yield``):
calling it returns a generator; when it is first advanced, the pre callbacks run
and the function is called (through around advice, which gets and returns the
generator); its items pass through; when it is exhausted, the post callbacks run
(``return_value``: what the generator returned); an exception raised while it
runs reaches the error callbacks. A generator closed early ends without post
callbacks, as a call that did not finish.

Shared by both dispatch twins: it calls only their Step methods and ``_rules``.
"""

from __future__ import annotations

import inspect
from typing import Any, AsyncGenerator, Callable, Generator

from ._rules import Proceed, call_around, first_admitted, proceed_not_awaited, run_steps
from .errors import StopTraining, note_callback

__all__ = ["run_chain_async", "run_chain_async_generator", "run_chain_generator"]


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
        note_callback(exc, step.label, step.event)
        raise
    except BaseException as exc:
        note_callback(exc, step.label, step.event)
        raise


async def _run_steps_async(steps: Any, obj: Any, args: list[Any], kwargs: dict[str, Any],
                     result: Any) -> Any:
    for i, step in enumerate(steps):
        if step.gate is None or step.gate.admit(obj):
            try:
                raw = await _settle(step, step.invoke(obj, args, kwargs, result))
            except StopIteration as exc:
                raise _stop_iteration(step) from exc
            except StopTraining:  # the phase's other callbacks first (_rules.finish_phase, awaited)
                try:
                    await _run_steps_async(steps[i + 1:], obj, args, kwargs, result)
                except StopTraining:
                    pass  # the first stop is the one raised
                raise
            result = step.absorb(obj, args, kwargs, raw, result)
    return result


async def _call_around_async(around: tuple[Any, ...], index: int, func: Callable[..., Any], obj: Any,
                             args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``_rules.call_around`` for an async join point: the advice's ``Proceed``
    returns a coroutine running the rest. One the advice never awaited is an error
    (the join point would silently not run); a proceed kept past the advice's call
    refuses to run, as in a sync call."""
    pass_obj = around[0].pass_obj  # a method's advice: the function takes the object
    index = first_admitted(around, index, obj)
    if index == len(around):
        result = func(obj, *args, **kwargs) if pass_obj else func(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result
    step = around[index]
    pending: Any = None  # the coroutine proceed returned

    async def inner(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return await _call_around_async(around, index + 1, func, obj, args, kwargs)
        except BaseException as exc:
            proceed.raised = exc  # raised when awaited: passed through, not the advice's own
            raise

    def rest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        nonlocal pending
        pending = inner(args, kwargs)
        return pending

    proceed = Proceed(step, rest)
    try:
        result = step.fn(obj, proceed, *args, **kwargs) if pass_obj else step.fn(proceed, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        if pending is not None and result is pending:  # it returned proceed(...) as it came
            result = await result
    except BaseException as exc:
        proceed.failed(exc)
        raise
    finally:
        proceed.ended()
        unawaited = pending is not None and inspect.getcoroutinestate(pending) == inspect.CORO_CREATED
        if unawaited:
            pending.close()  # no "never awaited" warning on top of the error
    if unawaited:
        raise proceed_not_awaited(step)
    return result


async def run_chain_async(chain: Any, func: Callable[..., Any], obj: Any,
                          args: list[Any], kwargs: dict[str, Any]) -> Any:
    try:
        await _run_steps_async(chain.pre, obj, args, kwargs, None)
        if chain.around:
            result = await _call_around_async(chain.around, 0, func, obj,
                                        tuple(args[1:] if chain.around[0].pass_obj else args), kwargs)
        else:
            result = func(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        return await _run_steps_async(chain.post, obj, args, kwargs, result)
    except Exception as exc:
        if chain.error and not isinstance(exc, StopTraining):
            await _run_steps_async(chain.error, obj, args, kwargs, exc)
        raise


# --- Generator join points ------------------------------------------------

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
        await _run_steps_async(chain.pre, obj, args, kwargs, None)
        if chain.around:  # advice may be async: `agen = await proceed(...)`
            inner = await _call_around_async(chain.around, 0, func, obj,
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
        await _run_steps_async(chain.post, obj, args, kwargs, None)
    except Exception as exc:
        if chain.error and not isinstance(exc, StopTraining):
            await _run_steps_async(chain.error, obj, args, kwargs, exc)
        raise
