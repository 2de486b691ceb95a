"""``python -m hookwrap bench --step``: hook overhead as a share of a training step.

One step of a CPU MLP 64-64-10 (batch 8) split into 8 hookable join points,
with 2 callbacks on each (a pre callback that takes and returns an argument,
and a post callback that takes and returns the result).

The overhead (about a microsecond) is far below the noise of timing a whole
step twice, so it is measured where it can be: on the same loop with no-op
bodies, hooked minus plain. The real step is timed plainly, and the share is
their ratio. The direct A/B difference of two real steps is printed too, with
that caveat.
"""

from __future__ import annotations

import timeit
from typing import Any

EVENTS = ("train_step", "prepare_batch", "forward", "compute_loss", "backward",
          "optimizer_step", "zero_grad", "log_metrics")


class _Bodies:
    """The loop; what each step does is delegated to `ops` (torch, or no-ops)."""

    def __init__(self, ops: Any) -> None:
        self.ops = ops

    def prepare_batch(self, batch: Any) -> Any:
        return self.ops.prepare(batch)

    def forward(self, x: Any) -> Any:
        return self.ops.forward(x)

    def compute_loss(self, out: Any, y: Any) -> Any:
        return self.ops.loss(out, y)

    def backward(self, loss: Any) -> None:
        self.ops.backward(loss)

    def optimizer_step(self) -> None:
        self.ops.step()

    def zero_grad(self) -> None:
        self.ops.zero_grad()

    def log_metrics(self, loss: Any) -> Any:
        return loss

    def train_step(self, batch: Any) -> Any:
        x, y = self.prepare_batch(batch)
        out = self.forward(x)
        loss = self.compute_loss(out, y)
        self.backward(loss)
        self.optimizer_step()
        self.zero_grad()
        return self.log_metrics(loss)


def _pass(self: Any, value: Any) -> Any:
    return value


def _nothing(self: Any) -> None:
    return None


class _HandWritten(_Bodies):
    """The same loop with the same 16 callbacks called by hand inside it: what a
    user would write without hookwrap. Hooked minus this is hookwrap's own cost."""

    def prepare_batch(self, batch: Any) -> Any:
        return _pass(self, self.ops.prepare(_pass(self, batch)))

    def forward(self, x: Any) -> Any:
        return _pass(self, self.ops.forward(_pass(self, x)))

    def compute_loss(self, out: Any, y: Any) -> Any:
        return _pass(self, self.ops.loss(_pass(self, out), y))

    def backward(self, loss: Any) -> None:
        _pass(self, self.ops.backward(_pass(self, loss)))

    def optimizer_step(self) -> None:
        _nothing(self)
        _pass(self, self.ops.step())

    def zero_grad(self) -> None:
        _nothing(self)
        _pass(self, self.ops.zero_grad())

    def log_metrics(self, loss: Any) -> Any:
        return _pass(self, _pass(self, loss))

    def train_step(self, batch: Any) -> Any:
        x, y = self.prepare_batch(_pass(self, batch))
        out = self.forward(x)
        loss = self.compute_loss(out, y)
        self.backward(loss)
        self.optimizer_step()
        self.zero_grad()
        return _pass(self, self.log_metrics(loss))


class _TorchOps:
    def __init__(self) -> None:
        import warnings

        with warnings.catch_warnings():  # torch notes that NumPy is absent; not needed here
            warnings.simplefilter("ignore")
            import torch

        torch.manual_seed(0)
        torch.set_num_threads(1)  # a small model: threads add jitter, not speed
        self.torch = torch
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.batch = (torch.randn(8, 64), torch.randint(0, 10, (8,)))

    def prepare(self, batch: Any) -> Any:
        return batch

    def forward(self, x: Any) -> Any:
        return self.model(x)

    def loss(self, out: Any, y: Any) -> Any:
        return self.torch.nn.functional.cross_entropy(out, y)

    def backward(self, loss: Any) -> None:
        loss.backward()

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)


class _NoOps:
    batch = (1, 2)

    def prepare(self, batch: Any) -> Any:
        return batch

    def forward(self, x: Any) -> Any:
        return x

    def loss(self, out: Any, y: Any) -> Any:
        return out

    def backward(self, loss: Any) -> None:
        pass

    def step(self) -> None:
        pass

    def zero_grad(self) -> None:
        pass


def _hooked_class(hw: Any) -> type:
    namespace = {name: hw.hookable(vars(_Bodies)[name]) for name in EVENTS}
    namespace["__init__"] = vars(_Bodies)["__init__"]
    cls = type("HookedLoop", (hw.Hookable,), namespace)
    first_arg = {"train_step": "batch", "prepare_batch": "batch", "forward": "x",
                 "compute_loss": "out", "backward": "loss", "log_metrics": "loss"}
    for event in EVENTS:
        name = first_arg.get(event)
        if name is None:
            pre = _named("pre", event, "def pre(self):\n    pass\n")
        else:
            pre = _named("pre", event, f"def pre(self, {name}):\n    return {name}\n")
        post = _named("post", event, "def post(self, return_value):\n    return return_value\n")
        hw.before(cls, event, pre)
        hw.after(cls, event, post)
    return cls


def _named(kind: str, event: str, source: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # noqa: S102 - a callback with the parameter names of its event
    fn = namespace[kind]
    fn.__name__ = fn.__qualname__ = f"{kind}_{event}"
    return fn


def _time_pair(a: Any, b: Any, number: int, repeat: int) -> tuple[float, float]:
    """Best-of-``repeat`` seconds per step of ``a`` and ``b``, timed alternately so
    that drift of the machine falls on both alike."""
    timers = [timeit.Timer("obj.train_step(batch)", globals={"obj": o, "batch": o.ops.batch})
              for o in (a, b)]
    best = [float("inf"), float("inf")]
    for _ in range(repeat):
        for i, timer in enumerate(timers):
            best[i] = min(best[i], timer.timeit(number) / number)
    return best[0], best[1]


def measure_step(number: int = 2000, repeat: int = 7) -> dict[str, float]:
    import hookwrap as hw

    hooked_cls = _hooked_class(hw)
    plain_real, hooked_real = _Bodies(_TorchOps()), hooked_cls(_TorchOps())
    plain_noop, hooked_noop = _Bodies(_NoOps()), hooked_cls(_NoOps())
    hand_noop = _HandWritten(_NoOps())
    assert float(plain_real.train_step(plain_real.ops.batch).detach()) > 0  # it really trains
    plain_noop_t, hooked_noop_t = _time_pair(plain_noop, hooked_noop, number * 20, repeat)
    _, hand_noop_t = _time_pair(plain_noop, hand_noop, number * 20, repeat)
    step_t, hooked_t = _time_pair(plain_real, hooked_real, number, repeat)
    overhead = hooked_noop_t - plain_noop_t
    own = hooked_noop_t - hand_noop_t
    return {
        "step": step_t,
        "hooked_step": hooked_t,
        "overhead": overhead,
        "share": overhead / step_t,
        "own": own,
        "own_share": own / step_t,
        "ab_share": (hooked_t - step_t) / step_t,
        "extension": float(hw.USING_EXTENSION),
    }


def report(number: int = 2000) -> str:
    r = measure_step(number)
    impl = "compiled" if r["extension"] else "pure Python twin"
    return "\n".join([
        f"training step: CPU MLP 64-64-10, batch 8, 1 thread; 8 join points x 2 callbacks ({impl})",
        f"  step, no hooks                 {r['step'] * 1e6:9.1f} us",
        f"  hook overhead per step         {r['overhead'] * 1e9:9.0f} ns"
        f"   (same loop with no-op bodies: hooked - plain)",
        f"  overhead / step                {r['share'] * 100:9.2f} %",
        f"  of it hookwrap's own           {r['own'] * 1e9:9.0f} ns = {r['own_share'] * 100:.2f} %"
        f"   (beyond calling the 16 callbacks by hand)",
        f"  direct A/B of two real steps   {r['ab_share'] * 100:9.2f} %   (within timing noise)",
    ])
