"""Ready-made weaves of third-party code (presets of ``hookwrap run --preset NAME``).

Presets for third-party trainers: one call weaves a framework's training stages
under hookwrap's standard event names (``fit``, ``epoch``, ``step``, ``loss``,
``backward``, ``optimizer_step``, ``evaluate``), so the shipped callbacks of
``hookwrap.torch`` work on it with their default events, and ``hw.StopTraining``
raised by a callback stops the framework the way it stops itself.

Each framework has its own module, imported only when used (importing
``hookwrap`` or this package imports no framework):

```python
from hookwrap.integrations import transformers as hw_hf
with hw_hf.weave():                     # returns a handle; remove() restores
    hw.add_callback(trainer, EarlyStopping("eval_loss"))
    trainer.train()
```

``PRESETS`` maps a preset's name to ``"module:function"``, for tools (a CLI) that
look one up lazily: ``load("ignite")`` imports and returns that function; calling
it applies the weave and returns a handle whose ``remove()`` undoes it. (The
lightning preset needs your LightningModule subclass: ``weave(MyModule)``.)
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable, NamedTuple, TypeVar

from ..errors import HookError, closest
from ._weaving import PresetHandle

__all__ = ["PRESETS", "FrameworkMissing", "PresetHandle", "install_command", "load"]


class _Preset(NamedTuple):
    weave: str  # "module:function", imported only when the preset is used
    weaves: str  # what it weaves, as `hookwrap run --help` and the integrations page's table say
    framework: str  # the top-level module of what it weaves: importing this package never imports it
    extra: str  # the extra of hookwrap that installs it (a range from the version the tests use)
    from_cli: bool = True  # `hookwrap run --preset` applies it (lightning's needs your module class)


# The one list of presets: PRESETS, `hookwrap run --preset` (its help and its
# checks), the integrations page's table of presets (a test compares them) and the
# tests of tests/integrations/ read it. A new preset: its module, a line here, its
# tests (tests/integrations/test_NAME.py), its row and section on
# docs/guide/integrations.md, its reference on docs/reference/integrations.md.
_REGISTRY: dict[str, _Preset] = {
    "torch_optim": _Preset("hookwrap.integrations.torch_optim:weave_optimizers",
                           "step of every torch.optim optimizer", "torch", "torch"),
    "transformers": _Preset("hookwrap.integrations.transformers:weave", "Hugging Face Trainer",
                            "transformers", "transformers"),
    "lightning": _Preset("hookwrap.integrations.lightning:weave",
                         "your LightningModule subclass, in Lightning's Trainer", "lightning", "lightning",
                         from_cli=False),
    "ignite": _Preset("hookwrap.integrations.ignite:weave", "ignite Engine", "ignite", "ignite"),
    "accelerate": _Preset("hookwrap.integrations.accelerate:weave", "accelerate Accelerator", "accelerate",
                          "accelerate"),
    "fabric": _Preset("hookwrap.integrations.fabric:weave", "Lightning Fabric", "lightning", "lightning"),
    "pytorch_accelerated": _Preset("hookwrap.integrations.pytorch_accelerated:weave", "pytorch-accelerated Trainer",
                                   "pytorch_accelerated", "pytorch-accelerated"),
    "deepspeed": _Preset("hookwrap.integrations.deepspeed:weave", "DeepSpeedEngine", "deepspeed", "deepspeed"),
}

PRESETS: dict[str, str] = {name: preset.weave for name, preset in _REGISTRY.items()}


def load(name: str) -> Callable[..., Any]:
    """The ``weave`` function of preset ``name`` (imports its module, not the framework)."""
    if name not in PRESETS:
        raise HookError(f"hookwrap.integrations: no preset {name!r}." + closest(name, list(PRESETS))
                        + f" Presets: {', '.join(PRESETS)}.")
    module, _, function = PRESETS[name].partition(":")
    return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


def install_command(name: str) -> str:
    """What installs preset ``name``'s framework: its extra, with the torch installed
    here pinned on the same line (an unpinned torch may resolve to another build)."""
    from importlib.metadata import PackageNotFoundError, version

    extra = _REGISTRY[name].extra
    try:
        torch = "torch==" + version("torch").split("+")[0]
    except PackageNotFoundError:
        torch = "torch==<the torch version you use>"
    if extra == "deepspeed":  # built against the torch installed, not one pip fetches to build it
        return f"DS_BUILD_OPS=0 pip install --no-build-isolation 'hookwrap[deepspeed]' {torch}"
    return f"pip install 'hookwrap[{extra}]' {torch}"


class FrameworkMissing(ModuleNotFoundError):
    """Preset ``preset`` needs ``missing`` (a top-level module: its framework, or one
    the framework needs), which is not installed; the message says what installs it.
    ``hookwrap run --preset`` says it as bad input."""

    def __init__(self, preset: str, missing: str, name: str | None) -> None:
        super().__init__(f"hookwrap.integrations.{preset} weaves {_REGISTRY[preset].framework}, and {missing} is "
                         f"not installed here: install it ({install_command(preset)}, or your own version of it).",
                         name=name)
        self.preset, self.missing = preset, missing


_F = TypeVar("_F", bound=Callable[..., Any])


def needs_framework(name: str, *modules: str) -> Callable[[_F], _F]:
    """A preset's ``weave``: where its framework (or another of ``modules`` it needs)
    is not installed, ``FrameworkMissing``, which says what to install, not the bare
    import's error. Anything else missing is a bug, and goes on as itself."""
    needed = {_REGISTRY[name].framework, *modules}

    def decorate(weave: _F) -> _F:
        @functools.wraps(weave)
        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                return weave(*args, **kwargs)
            except ImportError as exc:
                missing = (exc.name or "").split(".")[0]
                if missing not in needed:
                    raise
                raise FrameworkMissing(name, missing, exc.name) from exc

        return checked  # type: ignore[return-value]

    return decorate
