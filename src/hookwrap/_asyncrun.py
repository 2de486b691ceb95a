"""The chain of an ``async def`` join point. Callbacks and around advice may be
sync or async; what an async one returns is awaited before the return contract
is applied. Shared by both dispatch implementations (it calls only their Step
methods)."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from ._policy import first_admitted
from .errors import (
    PROCEED_CALLED,
    PROCEED_ENDED,
    PROCEED_FRESH,
    StopTraining,
    note_callback,
    proceed_not_awaited,
    proceed_twice,
)

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
        note_callback(exc, step.label, step.event)
        raise
    except BaseException as exc:
        note_callback(exc, step.label, step.event)
        raise


async def _run_steps(steps: Any, obj: Any, args: list[Any], kwargs: dict[str, Any],
                     result: Any) -> Any:
    for i, step in enumerate(steps):
        if step.gate is None or step.gate.admit(obj):
            try:
                raw = await _settle(step, step.invoke(obj, args, kwargs, result))
            except StopIteration as exc:
                raise _stop_iteration(step) from exc
            except StopTraining:  # the phase's other callbacks first (_policy.finish_phase)
                try:
                    await _run_steps(steps[i + 1:], obj, args, kwargs, result)
                except StopTraining:
                    pass  # the first stop is the one raised
                raise
            result = step.absorb(obj, args, kwargs, raw, result)
    return result


async def _call_around(around: tuple[Any, ...], index: int, func: Callable[..., Any], obj: Any,
                       args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Await around advice ``index`` (skipping filtered ones), or the function: the
    dispatch modules' ``call_around`` for an async join point. Its ``proceed``
    returns a coroutine; one the advice never awaited is an error (the join point
    would silently not run), and a proceed kept past the advice's call refuses to
    run, as in the sync twins."""
    pass_obj = around[0].pass_obj  # a method's advice: the function takes the object
    index = first_admitted(around, index, obj)
    if index == len(around):
        result = func(obj, *args, **kwargs) if pass_obj else func(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result
    step = around[index]
    state = PROCEED_FRESH
    raised: BaseException | None = None
    pending: Any = None  # the coroutine proceed returned

    async def rest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        nonlocal raised
        try:
            return await _call_around(around, index + 1, func, obj, args, kwargs)
        except BaseException as exc:
            raised = exc  # passed through: not the around callback's own error
            raise

    def proceed(*args: Any, **kwargs: Any) -> Any:
        """Run the rest (inner advice, then the function): a coroutine to await."""
        nonlocal state, pending
        if state:
            raise proceed_twice(step, state)
        state = PROCEED_CALLED
        pending = rest(args, kwargs)
        return pending

    try:
        result = step.fn(obj, proceed, *args, **kwargs) if pass_obj else step.fn(proceed, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        if pending is not None and result is pending:  # it returned proceed(...) as it came
            result = await result
    except BaseException as exc:
        if exc is not raised:
            note_callback(exc, step.label, step.event)
        raise
    finally:
        if not state:  # a proceed kept for later: its call is over
            state = PROCEED_ENDED
        unawaited = pending is not None and inspect.getcoroutinestate(pending) == inspect.CORO_CREATED
        if unawaited:
            pending.close()  # no "never awaited" warning on top of the error
    if unawaited:
        raise proceed_not_awaited(step)
    return result


async def run_chain_async(chain: Any, func: Callable[..., Any], obj: Any,
                          args: list[Any], kwargs: dict[str, Any]) -> Any:
    try:
        await _run_steps(chain.pre, obj, args, kwargs, None)
        if chain.around:
            result = await _call_around(chain.around, 0, func, obj,
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


# For _genrun's async generators: the steps of one phase, and around advice.
run_steps_async = _run_steps
call_around_async = _call_around
