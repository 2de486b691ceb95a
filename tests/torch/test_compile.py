"""torch.compile over hookable code, both implementations: a hookable module, a
function calling hookable methods and functions, and a model whose
``nn.Linear.forward`` is woven, with the "eager" backend and the default
inductor. Callbacks registered before and after compiling fire; tensor-only
callbacks land in the graph with no break (counted with ``torch._dynamo.explain``
and proven by ``fullgraph=True``); a registration recompiles what ran its chain."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra")
nn = torch.nn
dynamo = pytest.importorskip("torch._dynamo")


def _has_cpp_compiler() -> bool:
    return any(shutil.which(cc) for cc in ("g++", "c++", "clang++"))


# torch's own modules warn when inductor imports them; not hookwrap's to fix.
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*torch.jit.*:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning"),
    pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores:UserWarning"),
]

needs_inductor = pytest.mark.skipif(
    not _has_cpp_compiler(), reason="inductor on the CPU needs a C++ compiler (none on PATH)")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    dynamo.reset()
    yield
    dynamo.reset()


class CountingBackend:
    """A torch.compile backend that counts the graphs it is given and runs them as traced."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        self.graphs += 1
        return gm.forward


def _net_class(hw: Any) -> Any:
    class Net(nn.Module, hw.Hookable):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 3)

        @hw.hookable
        def forward(self, x):
            return self.linear(x).relu()

    return Net


def _double_input(self: Any, x: Any) -> Any:
    return x * 2


def _identity(self: Any, x: Any) -> Any:
    return x


def _add_one(self: Any, return_value: Any) -> Any:
    return return_value + 1


def _break_counts(fn: Any, *args: Any) -> tuple[int, int]:
    dynamo.reset()
    explained = dynamo.explain(fn)(*args)
    dynamo.reset()
    return explained.graph_count, explained.graph_break_count


def test_a_hookable_module_compiles_with_its_callbacks_in_one_graph(hw):
    torch.manual_seed(0)
    model = _net_class(hw)()
    model.before("forward", _double_input)  # instance tier
    type(model).forward.after(_add_one)  # class tier
    x = torch.randn(2, 4)
    eager = model(x)
    assert torch.allclose(eager, model.linear(x * 2).relu() + 1)
    assert _break_counts(model, x) == (1, 0)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    assert torch.allclose(compiled(x), eager)


def test_a_function_calling_hookable_methods_and_functions_has_no_graph_break(hw):
    class Loop(hw.Hookable):
        @hw.hookable
        def loss(self, x):
            return (x * 3).sum()

    @hw.hookable
    def shift(x):
        return x - 1

    loop = Loop()
    loop.after("loss", lambda self, return_value: return_value + 100)
    shift.after(lambda return_value: return_value * 10)

    def step(x):
        return loop.loss(x) + shift(x).sum()

    x = torch.randn(5)
    eager = step(x)
    assert torch.allclose(eager, (x * 3).sum() + 100 + ((x - 1) * 10).sum())
    assert _break_counts(step, x) == (1, 0)
    assert torch.allclose(torch.compile(step, backend="eager", fullgraph=True)(x), eager)


def test_hookable_classmethods_and_staticmethods_run_their_callbacks_compiled(hw):
    # The compiled twin's classmethod is a graph break (Dynamo binds classmethods
    # of Python functions only); its callbacks still run, each compiled on its own.
    class Loop(hw.Hookable):
        @classmethod
        @hw.hookable
        def scale(cls, x):
            return x / 2

        @staticmethod
        @hw.hookable
        def shift(x):
            return x - 1

    Loop.scale.before(lambda x: x * 4)
    Loop.shift.after(lambda return_value: return_value * 10)

    def step(x):
        return Loop.scale(x) + Loop().shift(x)

    x = torch.randn(5)
    expected = x * 2 + (x - 1) * 10
    assert torch.allclose(step(x), expected)
    compiled = torch.compile(step, backend="eager")
    for _ in range(2):
        assert torch.allclose(compiled(x), expected)


def test_callbacks_registered_after_compiling_fire_and_a_removed_one_stops(hw):
    torch.manual_seed(0)
    model = _net_class(hw)()
    backend = CountingBackend()
    # The compiled twin rebuilds a traced chain when a registration drops it, so the
    # recompiled code has no break: fullgraph=True survives registrations.
    compiled = torch.compile(model, backend=backend, fullgraph=hw.USING_EXTENSION)
    x = torch.randn(2, 4)
    plain = model.linear(x).relu()
    assert torch.allclose(model(x), plain)
    assert torch.allclose(compiled(x), plain)
    graphs = backend.graphs
    handle = model.before("forward", _double_input)
    for _ in range(4):  # a registration recompiles what ran the chain ...
        assert torch.allclose(compiled(x), model.linear(x * 2).relu())
    if hw.USING_EXTENSION:
        assert backend.graphs == graphs + 1  # once, whole
    graphs = backend.graphs
    dynamo.utils.counters.clear()
    for _ in range(3):  # ... and then its compiled code holds the whole chain
        assert torch.allclose(compiled(x), model.linear(x * 2).relu())
    assert backend.graphs == graphs and not dynamo.utils.counters["graph_break"]
    handle.remove()
    for _ in range(2):
        assert torch.allclose(compiled(x), plain)


@pytest.mark.parametrize("had_callbacks", [False, True])
def test_two_compiled_instances_each_run_their_own_callbacks(hw, had_callbacks):
    """Compiled code traced for one instance is not reused for another whose
    callbacks differ: b's first callback runs in b's compiled calls, even when a's
    compiled code runs first after the registration (it did not, in the compiled
    twin, where the trace read the instance's state through its __dict__)."""
    torch.manual_seed(0)
    Net = _net_class(hw)
    a, b = Net(), Net()
    if had_callbacks:
        a.before("forward", _identity)
        b.before("forward", _identity)
    ca, cb = torch.compile(a, backend="eager"), torch.compile(b, backend="eager")
    x = torch.randn(2, 4)
    ca(x)
    cb(x)
    b.before("forward", _double_input)
    for _ in range(3):
        assert torch.allclose(ca(x), a.linear(x).relu())
        assert torch.allclose(cb(x), b.linear(x * 2).relu())


def test_a_callback_with_python_side_effects_runs_once_per_compiled_call(hw):
    model = _net_class(hw)()
    seen: list[int] = []

    def count(self: Any, x: Any) -> Any:
        seen.append(x.shape[0])  # replayed by the compiled code (Dynamo may recompile)
        return x

    model.before("forward", count)
    compiled = torch.compile(model, backend="eager")
    for rows in (1, 2, 3):
        compiled(torch.randn(rows, 4))
    assert seen == [1, 2, 3]


def test_a_module_emitting_a_custom_event_compiles_and_follows_registrations(hw):
    """``self.emit`` inside a compiled forward: once the event has been emitted,
    one graph (fullgraph=True). Gathering an event's listeners is kept out of
    traces, so a listener added or removed after compiling costs one graph break
    where it is gathered again, and is followed."""

    class Net(nn.Module, hw.Hookable):
        emits = ("on_hidden",)

        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 3)

        def forward(self, x):
            hidden = self.linear(x)
            self.emit("on_hidden", hidden=hidden, scale=2)
            return hidden.relu()

    torch.manual_seed(0)
    model = Net()
    seen: list[Any] = []
    model.on("on_hidden", lambda self, hidden: seen.append(("hidden", tuple(hidden.shape))))
    x = torch.randn(2, 4)
    model(x)  # gathered and planned eagerly
    seen.clear()
    assert torch.allclose(torch.compile(model, backend="eager", fullgraph=True)(x),
                          model.linear(x).relu())
    assert seen == [("hidden", (2, 3))]
    dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    handle = model.on("on_hidden", lambda self, scale: seen.append(("scale", scale)))
    for _ in range(2):
        seen.clear()
        compiled(x)
        assert seen == [("hidden", (2, 3)), ("scale", 2)]
    handle.remove()
    for _ in range(2):
        seen.clear()
        compiled(x)
        assert seen == [("hidden", (2, 3))]


def test_a_woven_linear_forward_under_compile_and_after_remove(hw):
    torch.manual_seed(0)
    original = nn.Linear.__dict__["forward"]
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    plain = model(x)
    woven = hw.weave(nn.Linear, "forward")
    try:
        handle = nn.Linear.forward.after(lambda self, return_value: return_value * 2)
        eager = model(x)
        assert not torch.allclose(eager, plain)
        assert _break_counts(model, x) == (1, 0)
        assert torch.allclose(torch.compile(model, backend="eager", fullgraph=True)(x), eager)
        handle.remove()
        assert torch.allclose(model(x), plain)
    finally:
        woven.remove()
    assert nn.Linear.__dict__["forward"] is original
    assert torch.allclose(torch.compile(model, backend="eager")(x), plain)


def test_weaving_after_compiling_drops_the_code_compiled_before(hw):
    # Dynamo trusts torch.nn's classes not to change: code compiled before the
    # weave would run the old forward, so weave() and remove() drop compiled code.
    model = nn.Sequential(nn.Linear(4, 3))
    x = torch.randn(2, 4)
    compiled = torch.compile(model, backend="eager")
    plain = compiled(x)
    woven = hw.weave(nn.Linear, "forward")
    try:
        nn.Linear.forward.after(_add_one)
        assert torch.allclose(compiled(x), plain + 1)
    finally:
        woven.remove()
    assert torch.allclose(compiled(x), plain)


@needs_inductor
def test_inductor_compiles_a_hookable_module_a_function_and_a_woven_linear(hw):
    torch.manual_seed(0)
    model = _net_class(hw)()
    model.before("forward", _double_input)
    x = torch.randn(2, 4)
    compiled = torch.compile(model)  # the default backend, first called compiled
    assert torch.allclose(compiled(x), model.linear(x * 2).relu(), atol=1e-6)
    class Loop(hw.Hookable):
        @hw.hookable
        def loss(self, out):
            return out.sum()

    loop = Loop()
    loop.after("loss", lambda self, return_value: return_value * 3)

    def step(x):  # a function calling a hookable module and a hookable method
        return loop.loss(model(x))

    assert torch.allclose(torch.compile(step)(x), model.linear(x * 2).relu().sum() * 3, atol=1e-5)
    woven = hw.weave(nn.Linear, "forward")
    try:
        nn.Linear.forward.after(_add_one)
        expected = (nn.functional.linear(x * 2, model.linear.weight, model.linear.bias) + 1).relu()
        assert torch.allclose(model(x), expected, atol=1e-6)
        assert torch.allclose(compiled(x), expected, atol=1e-6)  # weaving dropped the old code
    finally:
        woven.remove()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
def test_a_hookable_module_compiles_on_cuda_with_its_callbacks_in_the_graph(hw):
    torch.manual_seed(0)
    model = _net_class(hw)().cuda()
    model.before("forward", _double_input)
    model.after("forward", _add_one)
    x = torch.randn(8, 4, device="cuda")
    eager = model(x)
    assert _break_counts(model, x) == (1, 0)
    compiled = torch.compile(model, fullgraph=True)  # inductor, Triton kernels
    assert torch.allclose(compiled(x), eager, atol=1e-5)
    model.after("forward", _add_one)  # registered after compiling: recompiles
    compiled = torch.compile(model)
    assert torch.allclose(compiled(x), eager + 1, atol=1e-5)


def test_a_full_collection_while_torch_compile_works_keeps_the_chains_it_traced(hw):
    """A gen-2 collection started inside torch.compile (Dynamo allocates a lot) emptied
    the hot caches whose runners the guards being built read: Dynamo failed with
    'KeyError: 2' while creating a guard. Such a collection now leaves them."""
    import sys

    from torch._guards import CompileContext, compile_context

    class Loop(hw.Hookable):
        @hw.hookable
        def step(self, x: Any) -> Any:
            return x

    loop = Loop()
    loop.before("step", lambda self, x: x)
    loop.step(1)
    jp = vars(Loop)["step"]
    jp = getattr(jp, "__hookwrap_join_point__", jp)
    release = sys.modules["hookwrap._chains"]._release_hot_caches
    chain = jp._chain if hasattr(jp, "_chain") else None
    with compile_context(CompileContext(None)):
        release("start", {"generation": 2})
    if chain is not None:  # the pure twin's hot cache is readable: it was kept
        assert jp._chain is chain
    release("start", {"generation": 2})  # outside a compile: emptied as before
    if chain is not None:
        assert jp._chain is not chain
    assert loop.step(2) == 2


@pytest.mark.parametrize("with_callback", [False, True], ids=["bare", "with-callback"])
@pytest.mark.parametrize("woven_class", ["user-module", "linear"])
def test_torch_compile_of_a_module_whose_own_forward_is_woven(hw, woven_class, with_callback):
    # weave() stored the bare compiled join point as `forward`, where torch.compile
    # (Dynamo's trace_rules) asks for the source file of the module's forward:
    # "getfile returned None for function/method <bound method GPT.forward ...>".
    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 3)

        def forward(self, x):
            return self.linear(x).relu()

    cls = GPT if woven_class == "user-module" else nn.Linear
    original = cls.__dict__["forward"]
    torch.manual_seed(0)
    model = GPT() if cls is GPT else nn.Linear(4, 3)
    x = torch.randn(2, 4)
    plain = model(x)
    woven = hw.weave(cls, "forward")
    try:
        seen: list[tuple[int, ...]] = []
        if with_callback:
            def record(self, return_value):
                seen.append(tuple(return_value.shape))
                return return_value

            hw.after(cls, "forward", record)
        uncompiled = model(x)
        assert torch.equal(uncompiled, plain)
        compiled = torch.compile(model, backend="eager")
        for _ in range(2):
            assert torch.equal(compiled(x), uncompiled)
        assert seen == ([(2, 3)] * 3 if with_callback else [])
    finally:
        woven.remove()
    assert cls.__dict__["forward"] is original
    assert torch.equal(torch.compile(model, backend="eager")(x), plain)
