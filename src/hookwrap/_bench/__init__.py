"""``hookwrap bench``: the dispatch benchmark scenarios, and the command.

Every number is a ratio to a bare ``obj.step(batch)`` call measured in the same
process, because these machines are shared and noisy: absolute nanoseconds
drift, ratios measured side by side hold. The same scenarios back the
pytest-benchmark suite in ``bench/`` and the instruction counts of
``tools/bench_instructions.py``. ``others`` times the same callbacks through
other hook systems and ``step`` the share of a training step (``--step``): both
are part of the command's report.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import timeit
from typing import Any, Callable

from .._joinpoints import reader
from .others import SYSTEMS, absent, other_scenarios

KS = (0, 1, 4, 16)


def _pre(self: Any, batch: Any) -> Any:
    return batch


def _post(self: Any, return_value: Any) -> Any:
    return return_value


def _around(self: Any, proceed: Any, batch: Any) -> Any:
    return proceed(batch)


def _pre_free(batch: Any) -> Any:
    return batch


def _listen(self: Any, batch: Any) -> None:
    return None


class Observer:
    """A callback object whose method a shipped callback's reader calls."""

    def see(self, obj: Any, batch: Any) -> None:
        return None


Scenario = tuple[str, dict[str, Any]]  # (statement, namespace) timed as written


def model_class(hw: Any) -> Any:
    """The class the scenarios call: bare methods, the hand-written loops that
    stand for hookwrap, and the join points (also used by tools/bench_instructions.py)."""

    class Model(hw.Hookable):
        emits = ("on_batch",)
        fns: tuple[Any, ...] = ()
        counts: list[int] = []

        def bare(self, batch: Any) -> Any:
            return batch

        @classmethod
        def bare_build(cls, batch: Any) -> Any:
            return batch

        def hand_loop(self, batch: Any) -> Any:
            for f in self.fns:
                batch = f(self, batch)
            return batch

        def hand_loop_every_2(self, batch: Any) -> Any:
            # What every=2 replaces: a counter and a modulo test per callback.
            counts = self.counts
            for i, f in enumerate(self.fns):
                counts[i] += 1
                if counts[i] % 2 == 0:
                    batch = f(self, batch)
            return batch

        def read_two(self) -> Any:  # the object's own code, which hookwrap must not slow
            return self.first, self.second

        def hand_emit(self, batch: Any) -> None:
            for f in self.fns:
                f(self, batch=batch)

        @hw.hookable
        def step(self, batch: Any) -> Any:
            return batch

        @hw.hookable
        @classmethod
        def build(cls, batch: Any) -> Any:
            return batch

    return Model


def scenarios(hw: Any) -> dict[str, Scenario]:
    """Name -> the statement making one call of that kind, and its namespace.

    Statements are timed as written (``obj.step(batch)``), with no wrapper call
    around them that would dilute every ratio."""
    import wrapt

    def body(self: Any, batch: Any) -> Any:
        return batch

    def closure_deco(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return f(*args, **kwargs)

        return wrapper

    def hand_wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        # What around advice replaces: a closure calling what it wraps.
        def wrapper(self: Any, batch: Any) -> Any:
            return f(self, batch)

        return wrapper

    @wrapt.decorator
    def passthrough(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        return wrapped(*args, **kwargs)

    Model = model_class(hw)
    Model.wrapped_closure = closure_deco(body)
    Model.wrapped_wrapt = passthrough(body)

    def free_bare(batch: Any) -> Any:
        return batch

    out: dict[str, Scenario] = {}
    batch = [1, 2, 3]
    plain = Model()
    out["bare method"] = ("obj.bare(batch)", {"obj": plain, "batch": batch})
    out["bare function"] = ("fn(batch)", {"fn": free_bare, "batch": batch})
    out["functools.wraps closure"] = ("obj.wrapped_closure(batch)", {"obj": plain, "batch": batch})
    out["wrapt.decorator pass-through"] = ("obj.wrapped_wrapt(batch)", {"obj": plain, "batch": batch})
    out["bare classmethod"] = ("cls.bare_build(batch)", {"cls": Model, "batch": batch})
    # Instance callbacks on one object make its class look for instance state on
    # every call; measure that apart from the plain "nothing registered" case.
    Shared = type("Shared", (Model,), {})

    Shared().before("step", _pre)
    out["hookwrap k=0, a sibling has callbacks"] = ("obj.step(batch)", {"obj": Shared(), "batch": batch})
    for k in KS:
        loop = Model()
        loop.fns = (_pre,) * k
        loop.counts = [0] * k
        out[f"hand loop k={k}"] = ("obj.hand_loop(batch)", {"obj": loop, "batch": batch})
        out[f"hand loop every=2 k={k}"] = ("obj.hand_loop_every_2(batch)", {"obj": loop, "batch": batch})
        wrapped = body
        for _ in range(k):
            wrapped = hand_wrap(wrapped)
        hand = type("HandWrapped", (Model,), {"wrapped": wrapped})()
        out[f"hand wrap k={k}"] = ("obj.wrapped(batch)", {"obj": hand, "batch": batch})
        for kind, verb, fn, extra in [
            ("pre", "before", _pre, {}),
            ("post", "after", _post, {}),
            ("around", "around", _around, {}),
            ("pre every=2", "before", _pre, {"every": 2}),
            # How hookwrap.torch's callbacks attach: a reader in front of their method.
            ("pre via reader", "before", reader(Observer().see, "pre-", "batch"), {}),
        ]:
            obj = type("Model", (Model,), {})()  # a class of its own per scenario
            for _ in range(k):
                getattr(obj, verb)("step", fn, **extra)
            out[f"hookwrap {kind} k={k}"] = ("obj.step(batch)", {"obj": obj, "batch": batch})

        @hw.hookable
        def free(batch: Any) -> Any:
            return batch

        for _ in range(k):
            free.before(_pre_free)
        out[f"hookwrap function pre k={k}"] = ("fn(batch)", {"fn": free, "batch": batch})

        Sub = type("Sub", (Model,), {})

        for _ in range(k):
            hw.before(Sub, "build", lambda cls, batch: batch)
        out[f"hookwrap classmethod pre k={k}"] = ("cls.build(batch)", {"cls": Sub, "batch": batch})
    # Custom events: emit() with k listeners, against a hand-written loop over them.
    Emitter = type("Emitter", (Model,), {})  # its instances' listeners stay off Model
    for k in KS:
        emitter, hand = Emitter(), Emitter()
        hand.fns = (_listen,) * k
        for _ in range(k):
            emitter.on("on_batch", _listen)
        out[f"hand emit loop k={k}"] = ("obj.hand_emit(batch)", {"obj": hand, "batch": batch})
        out[f"hookwrap emit k={k}"] = ("obj.emit('on_batch', batch=batch)",
                                      {"obj": emitter, "batch": batch})
    # A scoped registration inside a loop (a `with` block, a once=True callback, a
    # removed handle), then a call of an unrelated join point: what invalidation costs.
    scoped, unrelated = type("Scoped", (Model,), {})(), type("Unrelated", (Model,), {})()
    unrelated.before("step", _pre)
    out[REGISTRATION_CYCLE] = (
        "with obj.before('step', fn):\n    obj.step(batch)\nother.step(batch)",
        {"obj": scoped, "other": unrelated, "fn": _pre, "batch": batch},
    )
    return out


REGISTRATION_CYCLE = "scoped registration cycle"


def as_callable(scenario: Scenario) -> Callable[[], Any]:
    """The scenario as a zero-argument function (for pytest-benchmark)."""
    stmt, namespace = scenario
    if "\n" in stmt:  # several statements: run them, return the batch
        lines = stmt.splitlines() + ["return batch"]
    else:
        lines = [f"return {stmt}"]
    source = "def call():\n" + "".join(f"    {line}\n" for line in lines)
    scope = dict(namespace)
    exec(source, scope)  # noqa: S102 - our own statement
    return scope["call"]  # type: ignore[no-any-return]


def _timer(scenario: Scenario) -> timeit.Timer:
    stmt, namespace = scenario
    return timeit.Timer(stmt, globals=dict(namespace))


def measure(hw: Any, number: int = 20000, repeat: int = 7, others: bool = False) -> dict[str, float]:
    """Each scenario's cost as a ratio to a bare ``obj.step(batch)`` call (with
    ``others``, also the other hook systems of ``others``).

    Each scenario is timed alternately with the bare call and divided by that
    adjacent bare timing (best of ``repeat`` each): drift of a shared machine moves
    both alike and cancels in the ratio. The rounds go over every scenario in
    turn, so that a slow spell of a few seconds (a neighbour on the machine) spoils
    one round of many scenarios, which the best of the others outvotes, not every
    round of one. ``"unit"`` holds the best bare call in seconds, to turn ratios
    back into nanoseconds.
    """
    calls = scenarios(hw)
    if others:
        calls.update(other_scenarios(hw, KS))
    bare = _timer(calls["bare method"])
    # A registration cycle costs thousands of bare calls: time fewer of them.
    timers = {name: (_timer(scenario), max(number // 200, 10) if name == REGISTRATION_CYCLE else number)
              for name, scenario in calls.items()}
    best_bare = dict.fromkeys(timers, float("inf"))
    best = dict.fromkeys(timers, float("inf"))
    for _ in range(repeat):
        for name, (timer, count) in timers.items():
            best_bare[name] = min(best_bare[name], bare.timeit(number) / number)
            best[name] = min(best[name], timer.timeit(count) / count)
    ratios: dict[str, float] = {"unit": min(best_bare.values())}
    ratios.update({name: best[name] / best_bare[name] for name in timers})
    return ratios


def _slope(ratios: dict[str, float], prefix: str) -> float:
    """Bare calls per added callback: least squares over every k (one noisy point
    moves a fit less than a two-point difference)."""
    xs = list(KS)
    ys = [ratios[f"{prefix} k={k}"] for k in xs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def table(ratios: dict[str, float], implementation: str) -> str:
    unit = ratios["unit"]
    lines = [f"hookwrap dispatch: {implementation}; ratios to a bare obj.step(batch) call "
             f"({unit * 1e9:.1f} ns here), each timed beside it", ""]
    lines.append(f"  {'scenario':<36}{'ns/call':>10}{'ratio':>9}")
    for name, ratio in ratios.items():
        if name != "unit" and not name.startswith(SYSTEMS):
            lines.append(f"  {name:<36}{ratio * unit * 1e9:>10.1f}{ratio:>8.2f}x")
    hand = _slope(ratios, "hand loop")
    lines.append("")
    function = ratios[f"hookwrap function pre k={KS[0]}"] / ratios["bare function"]
    lines.append(f"  hookable plain function, nothing registered, vs a bare function call: {function:.2f}x")
    cm = ratios[f"hookwrap classmethod pre k={KS[0]}"] / ratios["bare classmethod"]
    lines.append(f"  hookable classmethod, nothing registered, vs a bare classmethod call: {cm:.2f}x")
    lines.append("")
    lines.append(f"  per-callback cost (slope over k = {', '.join(map(str, KS))}), and its ratio to the hand-written loop's:")
    lines.append(f"  {'hand loop':<36}{hand * unit * 1e9:>10.1f}{1:>8.2f}x")
    for prefix in ["hookwrap pre", "hookwrap post", "hookwrap around", "hookwrap pre every=2",
                   "hookwrap pre via reader", "hookwrap function pre", "hookwrap classmethod pre"]:
        slope = _slope(ratios, prefix)
        lines.append(f"  {prefix:<36}{slope * unit * 1e9:>10.1f}{slope / hand:>8.2f}x")
    hand_every = _slope(ratios, "hand loop every=2")
    every = _slope(ratios, "hookwrap pre every=2")
    lines.append(f"  {'hand loop every=2 (count, % 2)':<36}{hand_every * unit * 1e9:>10.1f}{1:>8.2f}x")
    lines.append(f"  {'hookwrap pre every=2, vs that':<36}{every * unit * 1e9:>10.1f}{every / hand_every:>8.2f}x")
    hand_wrap = _slope(ratios, "hand wrap")
    around = _slope(ratios, "hookwrap around")
    lines.append(f"  {'hand wrap (a closure calling it)':<36}{hand_wrap * unit * 1e9:>10.1f}{1:>8.2f}x")
    lines.append(f"  {'hookwrap around, vs that':<36}{around * unit * 1e9:>10.1f}{around / hand_wrap:>8.2f}x")
    hand_emit = _slope(ratios, "hand emit loop")
    emit = _slope(ratios, "hookwrap emit")
    lines.append(f"  {'hand emit loop (keyword call)':<36}{hand_emit * unit * 1e9:>10.1f}{1:>8.2f}x")
    lines.append(f"  {'hookwrap emit':<36}{emit * unit * 1e9:>10.1f}{emit / hand_emit:>8.2f}x"
                 f"   (k=0: {ratios[f'hookwrap emit k={KS[0]}'] / ratios[f'hand emit loop k={KS[0]}']:.2f}x"
                 f" the hand loop's call)")
    return "\n".join(lines)


def others_table(ratios: dict[str, float]) -> str:
    """The other hook systems beside hookwrap, from the same run as ``table``."""
    unit = ratios["unit"]
    hand = _slope(ratios, "hand loop")
    lines = ["  beside other hook systems (the same k callbacks; ratios as above):",
             f"  {'system':<36}{'k=0 ns':>10}{'per callback ns':>17}{'vs hand loop':>14}"]
    rows = [("hookwrap pre (instance tier)", "hookwrap pre")]
    rows += [(system, system) for system in SYSTEMS if f"{system} k={KS[0]}" in ratios]
    for label, prefix in rows:
        slope = _slope(ratios, prefix)
        lines.append(f"  {label:<36}{ratios[f'{prefix} k={KS[0]}'] * unit * 1e9:>10.1f}"
                     f"{slope * unit * 1e9:>17.1f}{slope / hand:>13.2f}x")
    lines += [f"  {system}: left out, {why}" for system, why in absent().items()]
    return "\n".join(lines)


def run_one(number: int, step: bool = False) -> str:
    """The ratio table (and with ``step``, the training-step share) for the
    implementation this process uses."""
    import hookwrap as hw

    name = "compiled (hookwrap._fast)" if hw.USING_EXTENSION else "pure Python twin (hookwrap._fast_py)"
    ratios = measure(hw, number=number, others=True)
    out = table(ratios, name) + "\n\n" + others_table(ratios)
    if step:
        from .step import report

        out += "\n\n" + report()
    return out


def main(number: int = 20000, both: bool = True, step: bool = False) -> int:
    """Print the table for the compiled dispatch, then (``both``) for the pure twin,
    each measured in a fresh process of its own."""
    if step:
        try:
            import torch  # noqa: F401
        except ImportError:
            sys.stderr.write(
                "python -m hookwrap bench --step needs torch: pip install 'hookwrap[torch]' "
                "(on these machines, pip install torch==2.13.0 takes the CPU wheel on disk).\n"
            )
            return 2
    if not both:
        print(run_one(number, step))
        return 0
    for flag in ("", "1"):
        env = dict(os.environ, HOOKWRAP_NO_EXTENSIONS=flag)
        code = f"from hookwrap._bench import run_one; print(run_one({number}, {step}))"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if out.returncode:
            sys.stderr.write(out.stderr)
            return out.returncode
        print(out.stdout)
    return 0
