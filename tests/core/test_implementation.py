"""The switch between the compiled dispatch and its pure twin."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _using_extension(env_value):
    env = dict(os.environ)
    env.pop("HOOKWRAP_NO_EXTENSIONS", None)
    if env_value is not None:
        env["HOOKWRAP_NO_EXTENSIONS"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", "import hookwrap, hookwrap._dispatch as d; print(hookwrap.USING_EXTENSION, d.impl.__name__)"],
        env=env, cwd=ROOT, capture_output=True, text=True, check=True,
    )
    return out.stdout.split()


def test_env_var_forces_the_pure_twin():
    assert _using_extension("1") == ["False", "hookwrap._fast_py"]


def test_compiled_module_is_used_by_default_when_built():
    try:
        import hookwrap._fast  # noqa: F401
    except ImportError:
        if os.environ.get("HOOKWRAP_REQUIRE_EXTENSIONS"):
            raise
        pytest.skip("hookwrap._fast is not built")
    assert _using_extension(None) == ["True", "hookwrap._fast"]


def test_fixture_gives_the_implementation_its_id_names(hw, request):
    expected = "c-extension" in request.node.callspec.id
    assert hw.USING_EXTENSION is expected


def test_both_twins_define_the_contract_and_nothing_else_in_common():
    """The twins share ten names (_dispatch.TWIN_NAMES); all else they share is _rules',
    written once, so neither twin may grow a public name the other
    lacks. The pure twin takes two of the ten from _rules as they are: the rules
    of around advice and of emit, which the compiled twin mirrors."""
    fast = pytest.importorskip("hookwrap._fast")
    import hookwrap._fast_py as pure
    from hookwrap import _dispatch, _rules

    def own(module):  # public classes and functions the module defines, not imports
        return {n for n, v in vars(module).items() if not n.startswith("_")
                and callable(v) and getattr(v, "__module__", None) == module.__name__}

    assert len(_dispatch.TWIN_NAMES) <= 10
    reference = {n for n in _dispatch.TWIN_NAMES if getattr(pure, n) is getattr(_rules, n, None)}
    assert reference == {"call_around", "emitter"}
    assert pure.Step.absorb is _rules.absorb  # the return contract, as written there
    generators = {"dispatcher", "emit_runner", "generated_runner", "slot_count"}  # of its own code
    assert own(pure) | reference == set(_dispatch.TWIN_NAMES) | generators
    assert own(fast) - {"pinned_constants"} == set(_dispatch.TWIN_NAMES)
    for name in _dispatch.TWIN_NAMES:
        assert getattr(_dispatch, name) is getattr(fast if _dispatch.USING_EXTENSION else pure, name)


def test_compiled_constants_are_the_plans_ones():
    fast = pytest.importorskip("hookwrap._fast")
    from hookwrap import _rules

    pinned = fast.pinned_constants()
    assert pinned == {name: getattr(_rules, name) for name in pinned}
    assert len(pinned) == 20  # every kind, phase, binding and slot mark, the argument bound, how far a guarded call got


def test_public_names(hw):
    assert hw.__all__ == sorted(hw.__all__)
    assert hw.CallbackMixin is hw.Hookable
    for name in hw.__all__:
        assert hasattr(hw, name)
    assert issubclass(hw.CallbackSignatureError, hw.HookError)
    assert issubclass(hw.CallbackReturnError, hw.HookError)
    assert issubclass(hw.UnknownEventError, hw.HookError)
