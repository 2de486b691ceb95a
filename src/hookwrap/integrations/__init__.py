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

import importlib
from typing import Any, Callable, NamedTuple

from ..errors import HookError, closest
from ._weaving import PresetHandle

__all__ = ["PRESETS", "PresetHandle", "load"]


class _Preset(NamedTuple):
    weave: str  # "module:function", imported only when the preset is used
    weaves: str  # what it weaves, as `hookwrap run --help` and the integrations page's table say
    framework: str  # the top-level module of what it weaves: importing this package never imports it
    extra: str  # the extra of hookwrap pinning the version the tests use
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
                            "transformers", "thirdparty"),
    "lightning": _Preset("hookwrap.integrations.lightning:weave",
                         "your LightningModule subclass, in Lightning's Trainer", "lightning", "thirdparty",
                         from_cli=False),
    "ignite": _Preset("hookwrap.integrations.ignite:weave", "ignite Engine", "ignite", "thirdparty"),
    "accelerate": _Preset("hookwrap.integrations.accelerate:weave", "accelerate Accelerator", "accelerate",
                          "thirdparty"),
    "fabric": _Preset("hookwrap.integrations.fabric:weave", "Lightning Fabric", "lightning", "thirdparty"),
    "pytorch_accelerated": _Preset("hookwrap.integrations.pytorch_accelerated:weave", "pytorch-accelerated Trainer",
                                   "pytorch_accelerated", "thirdparty"),
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
