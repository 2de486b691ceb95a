"""The switch between the compiled dispatch and its pure twin."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def test_both_implementations_export_the_same_names():
    fast = pytest.importorskip("hookwrap._fast")
    import hookwrap._fast_py as pure

    def public(module):
        return {n for n in vars(module) if not n.startswith("_")} - {
            "annotations", "Any", "Callable", "FunctionType", "MethodType", "inspect", "Parameter", "cython", "NamedTuple", "cast",
        }

    assert public(fast) == public(pure)
    for name in ["FUNCTION", "METHOD", "CLASSMETHOD", "POS_ONLY", "POS_OR_KW", "KW_ONLY",
                 "VAR_POS", "VAR_KW", "RETURN_VALUE", "PRE", "POST", "STATE_KEY", "RECORD_ATTR"]:
        assert getattr(fast, name) == getattr(pure, name), name
    assert fast.MISSING is pure.MISSING


def test_public_names(hw):
    assert hw.__all__ == sorted(hw.__all__)
    assert hw.CallbackMixin is hw.Hookable
    for name in hw.__all__:
        assert hasattr(hw, name)
    assert issubclass(hw.CallbackSignatureError, hw.HookError)
    assert issubclass(hw.CallbackReturnError, hw.HookError)
    assert issubclass(hw.UnknownEventError, hw.HookError)
