"""The reader the shipped callbacks attach through: one value of an event handed to
a method of a callback object, returning what the callback contract asks (both
implementations; no torch needed)."""

from __future__ import annotations

import importlib
import pickle
from typing import Any

import pytest


@pytest.fixture
def reader(hw: Any) -> Any:
    return importlib.import_module("hookwrap._joinpoints").reader


class Seen:
    """A callback object recording what its handlers got (handlers return junk,
    which a reader must not pass on)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def value(self, obj: Any, *got: Any) -> str:
        self.calls.append(got)
        return "not passed on"


def make_loop(hw: Any) -> Any:
    class Loop(hw.Hookable):
        @hw.hookable
        def step(self, batch: Any, scale: float = 1.0) -> Any:
            return [x * scale for x in batch]

    return Loop()


def test_a_pre_reader_hands_the_argument_over_and_passes_it_on(hw, reader):
    loop, seen = make_loop(hw), Seen()
    loop.before("step", reader(seen.value, "pre-", "batch"))
    assert loop.step([1, 2], scale=2.0) == [2, 4]
    assert seen.calls == [([1, 2],)]


def test_a_post_reader_of_return_value_passes_it_on(hw, reader):
    loop, seen = make_loop(hw), Seen()
    loop.after("step", reader(seen.value, "post-", "return_value"))
    assert loop.step([3]) == [3]
    assert seen.calls == [([3],)]


def test_a_post_reader_of_an_argument_or_of_nothing_returns_none(hw, reader):
    loop, seen = make_loop(hw), Seen()
    loop.after("step", reader(seen.value, "post-", "scale"))
    loop.after("step", reader(seen.value, "post-"))
    assert loop.step([3], 0.5) == [1.5]  # a non-None return would be a CallbackReturnError
    assert seen.calls == [(0.5,), ()]


def test_extra_values_come_before_the_value_read(hw, reader):
    loop, seen = make_loop(hw), Seen()
    loop.after("step", reader(seen.value, "post-", "return_value", ("step", 7)))
    loop.before("step", reader(seen.value, "pre-", None, ("tick",)))
    loop.step([1])
    assert seen.calls == [("tick",), ("step", 7, [1])]


def test_a_reader_is_named_by_its_callback_and_ordered_by_it(hw, reader):
    loop, seen, first = make_loop(hw), Seen(), []
    loop.after("step", reader(seen.value, "post-", "return_value", ("x",)))
    loop.after("step", lambda self: first.append(len(seen.calls)), before=seen)
    loop.step([1])
    assert first == [0]  # ran before the reader of `seen`
    assert "Seen.value[x]" in str(hw.describe(loop, "step"))


def test_a_name_the_join_point_lacks_is_refused_at_registration(hw, reader):
    loop = make_loop(hw)
    with pytest.raises(hw.CallbackSignatureError, match=r"Seen\.value .*'pre-step'.*'batc'.*batch"):
        loop.before("step", reader(Seen().value, "pre-", "batc"))
    assert loop.callbacks == []


def test_a_reader_pickles_with_its_callback_object(reader):
    seen = Seen()
    copied = pickle.loads(pickle.dumps(reader(seen.value, "pre-", "batch", ("e",))))
    assert copied(None, [1]) == [1]
    assert copied.__self__.calls == [("e", [1])] and seen.calls == []
