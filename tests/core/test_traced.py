"""The Python twins of the compiled dispatch that torch.compile's Dynamo traces
(``_traced``; JoinPoint.__get__ and __call__ in the type's dictionary) do what
the C dispatch does, called directly: no torch needed, so every Python CI runs
it, including the versions whose type dictionaries the C helper writes to."""

from __future__ import annotations

from typing import Any

import pytest


def test_what_dynamo_traces_is_the_same_dispatch(hw):
    """The compiled twin shows Dynamo Python twins of its C slots (JoinPoint.__get__
    and __call__); called directly, they must do what the C dispatch does."""
    if not hw.USING_EXTENSION:
        pytest.skip("the pure twin's join points are Python already")
    from hookwrap._dispatch import JoinPoint
    from hookwrap._joinpoints import join_point_of

    class Trainer(hw.Hookable):
        callbacks = [("pre-step", lambda self, batch: batch + [1])]

        @hw.hookable
        def step(self, batch, scale=1):
            if scale < 0:
                raise ValueError("negative scale")
            return sum(batch) * scale

    errors: list[str] = []

    def hooked() -> Any:
        trainer = Trainer()
        trainer.after("step", lambda self, return_value: return_value + 10, every=2)
        trainer.around("step", lambda self, proceed, batch, scale=1: proceed(batch, scale=scale * 3))
        trainer.on_error("step", lambda self, exception: errors.append(str(exception)))
        return trainer

    reference, via_get, via_call = hooked(), hooked(), hooked()
    jp = join_point_of(vars(Trainer)["step"])
    python_get = vars(JoinPoint)["__get__"]
    python_call = vars(JoinPoint)["__call__"]
    assert type(python_get).__name__ == "function" and type(python_call).__name__ == "function"
    for batch, scale in [([1, 2], 1), ([3], 2), ([4, 5], 1)]:
        expected = reference.step(batch, scale=scale)
        assert python_get(jp, via_get, Trainer)(batch, scale=scale) == expected
        assert python_call(jp, via_call, batch, scale=scale) == expected
    with pytest.raises(ValueError):
        python_call(jp, via_call, [1], scale=-1)
    assert errors == ["negative scale"]


def test_a_registration_rebuilds_at_once_the_chains_compiled_code_traced(hw):
    """Dynamo reads ``Chain.traced`` for real while it traces; a registration that
    drops such a chain builds it again at once, so the code re-traced on the next
    call finds it built (no graph break). Chains never traced wait for a call."""
    if not hw.USING_EXTENSION:
        pytest.skip("the pure twin rebuilds on the next call (its chains are Python)")
    from hookwrap._joinpoints import join_point_of

    class Trainer(hw.Hookable):
        @hw.hookable
        def step(self, batch):
            return batch

        @hw.hookable
        def evaluate(self):
            return 0

    traced, untraced = Trainer(), Trainer()
    for obj in (traced, untraced):
        obj.before("step", lambda self, batch: batch)
        obj.step(1)
        obj.evaluate()
    step = join_point_of(vars(Trainer)["step"])
    evaluate = join_point_of(vars(Trainer)["evaluate"])
    state = traced.__dict__["__hookwrap__"]
    assert state.chains[step].traced is not None  # what Dynamo reads while tracing
    type_chain = vars(Trainer)["__hookwrap_class__"].chains[step]
    type_chain.traced  # noqa: B018 (read, as a trace reads it)

    traced.after("step", lambda self, return_value: return_value)
    rebuilt = state.chains[step]
    assert rebuilt.valid and len(rebuilt.post) == 1  # built again at once
    rebuilt.traced  # noqa: B018
    hw.before(Trainer, "step", lambda self, batch: batch)
    assert vars(Trainer)["__hookwrap_class__"].chains[step].valid  # the class's too
    assert state.chains[step].valid and len(state.chains[step].pre) == 2
    assert step not in untraced.__dict__["__hookwrap__"].chains  # never traced: waits
    fresh = Trainer()
    fresh.before("step", lambda self, batch: batch)  # the class chain was traced
    assert fresh.__dict__["__hookwrap__"].chains[step].valid
    assert evaluate in vars(Trainer)["__hookwrap_class__"].chains  # other events untouched
    assert traced.step(5) == 5 and untraced.step(5) == 5
