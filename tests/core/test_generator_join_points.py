"""A generator join point's call runs while its generator runs: pre callbacks when
it is first advanced, post callbacks when it is exhausted (``return_value`` is
what it returned), error callbacks for an exception raised while it runs; around
advice gets and returns the generator. The same for ``async def`` generators."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest


def _loop(hw: Any, log: list[Any]) -> Any:
    class Loop(hw.Hookable):
        @hw.hookable
        def batches(self, n):
            for i in range(n):
                log.append(("body", i))
                if i == 3:
                    raise ValueError("bad batch")
                sent = yield i
                if sent is not None:
                    log.append(("sent", sent))
            return "done"

        @hw.hookable
        async def stream(self, n):
            for i in range(n):
                log.append(("body", i))
                yield i

    return Loop()


def test_callbacks_run_around_the_iteration_not_the_call(hw):
    log: list[Any] = []
    loop = _loop(hw, log)
    loop.before("batches", lambda self, n: log.append(("pre", n)) or n)
    loop.after("batches", lambda self, return_value: log.append(("post", return_value)) or return_value.upper())
    loop.on_error("batches", lambda self, exception: log.append(("error", str(exception))))

    gen = loop.batches(2)
    assert inspect.isgenerator(gen) and log == []  # nothing runs until it is advanced
    assert list(gen) == [0, 1]
    assert log == [("pre", 2), ("body", 0), ("body", 1), ("post", "done")]

    gen = loop.batches(3)
    assert next(gen) == 0 and gen.send("hello") == 1  # send() reaches the generator
    with pytest.raises(StopIteration) as stop:
        gen.send(None)
        next(gen)
    assert stop.value.value == "DONE"  # the post callback's replacement is what it returns

    log.clear()
    with pytest.raises(ValueError, match="bad batch"):
        list(loop.batches(5))
    assert log == [("pre", 5), ("body", 0), ("body", 1), ("body", 2), ("body", 3), ("error", "bad batch")]


def test_a_generator_closed_early_runs_no_post_callback(hw):
    log: list[Any] = []
    loop = _loop(hw, log)
    loop.after("batches", lambda self, return_value: log.append("post") or return_value)
    loop.on_error("batches", lambda self, exception: log.append("error"))
    gen = loop.batches(3)
    assert next(gen) == 0
    gen.close()
    assert log == [("body", 0)]


def test_around_advice_gets_and_returns_the_generator(hw):
    log: list[Any] = []
    loop = _loop(hw, log)

    def doubled(self, proceed, n):
        return (2 * x for x in proceed(n))

    loop.around("batches", doubled)
    assert list(loop.batches(3)) == [0, 2, 4]


def test_async_generator_join_point(hw):
    log: list[Any] = []
    loop = _loop(hw, log)

    async def pre(self, n):
        log.append(("pre", n))
        return n

    async def wrapped(self, proceed, n):
        inner = await proceed(n)

        async def tens():
            async for x in inner:
                yield 10 * x
        return tens()

    loop.before("stream", pre)
    loop.after("stream", lambda self: log.append("post"))
    loop.around("stream", wrapped)

    async def collect() -> list[int]:
        return [x async for x in loop.stream(2)]

    stream = loop.stream(1)
    assert inspect.isasyncgen(stream) and log == []
    assert asyncio.run(collect()) == [0, 10]
    assert log == [("pre", 2), ("body", 0), ("body", 1), "post"]
    asyncio.run(stream.aclose())


def test_a_sync_generator_refuses_async_callbacks(hw):
    loop = _loop(hw, [])

    async def pre(self, n):
        return n

    with pytest.raises(hw.CallbackSignatureError, match="async"):
        loop.before("batches", pre)


def _async_feed(hw: Any, log: list[Any]) -> Any:
    class Feed(hw.Hookable):
        @hw.hookable
        async def feed(self, n):
            try:
                i = 0
                while i < n:
                    try:
                        sent = yield i
                    except KeyError as exc:
                        log.append(("caught", exc.args[0]))
                        sent = None
                        i = 100  # yields 100 next
                        continue
                    if sent is not None:
                        log.append(("sent", sent))
                    i += 1
            finally:
                log.append("finally")

    feed = Feed()
    feed.before("feed", lambda self: log.append("pre"))
    feed.after("feed", lambda self: log.append("post"))
    feed.on_error("feed", lambda self, exception: log.append(("error", type(exception).__name__)))
    return feed


def test_an_async_generator_join_point_forwards_asend_athrow_and_aclose(hw):
    # The wrapper took items with __anext__/asend only: aclose() never closed the
    # wrapped generator (its `finally` did not run) and athrow() never reached it.
    log: list[Any] = []
    feed = _async_feed(hw, log)

    async def run() -> None:
        gen = feed.feed(200)
        assert await gen.__anext__() == 0
        assert await gen.asend("a") == 1 and log[-1] == ("sent", "a")
        assert await gen.athrow(KeyError("k")) == 100  # handled inside: its next item
        assert log[-1] == ("caught", "k")
        await gen.aclose()
        assert log == ["pre", ("sent", "a"), ("caught", "k"), "finally"]  # closed early: no post

        log.clear()
        gen = feed.feed(3)
        assert await gen.__anext__() == 0
        with pytest.raises(ValueError, match="bad"):
            await gen.athrow(ValueError("bad"))  # not handled inside: raised out of it
        assert log == ["pre", "finally", ("error", "ValueError")]

        log.clear()
        assert [x async for x in feed.feed(2)] == [0, 1]
        assert log == ["pre", "finally", "post"]

    asyncio.run(run())
