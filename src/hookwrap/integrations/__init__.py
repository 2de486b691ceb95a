"""Ready-made weaves of third-party code (presets of ``hookwrap run --preset NAME``).

Presets for third-party trainers: one call weaves a framework's training stages
under hookwrap's standard event names (``fit``, ``epoch``, ``step``, ``loss``,
``backward``, ``optimizer_step``, ``evaluate``), so the shipped callbacks of
``hookwrap.torch`` work on it with their default events, and ``hw.StopTraining``
raised by a callback stops the framework the way it stops itself.

Each framework has its own module, imported only when used (importing
``hookwrap`` or this package imports no framework)::

    from hookwrap.integrations import transformers as hw_hf
    with hw_hf.weave():                     # returns a handle; remove() restores
        hw.add_callback(trainer, EarlyStopping("eval_loss"))
        trainer.train()

``PRESETS`` maps a preset's name to ``"module:function"``, for tools (a CLI) that
look one up lazily: ``load("ignite")`` imports and returns that function; calling
it applies the weave and returns a handle whose ``remove()`` undoes it. (The
lightning preset needs your LightningModule subclass: ``weave(MyModule)``.)
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from ..errors import HookError, closest
from ._weaving import PresetHandle

__all__ = ["PRESETS", "PresetHandle", "load"]

PRESETS: dict[str, str] = {
    "torch_optim": "hookwrap.integrations.torch_optim:weave_optimizers",
    "transformers": "hookwrap.integrations.transformers:weave",
    "lightning": "hookwrap.integrations.lightning:weave",
    "ignite": "hookwrap.integrations.ignite:weave",
    "accelerate": "hookwrap.integrations.accelerate:weave",
    "fabric": "hookwrap.integrations.fabric:weave",
}


def load(name: str) -> Callable[..., Any]:
    """The ``weave`` function of preset ``name`` (imports its module, not the framework)."""
    if name not in PRESETS:
        raise HookError(f"hookwrap.integrations: no preset {name!r}." + closest(name, list(PRESETS))
                        + f" Presets: {', '.join(PRESETS)}.")
    module, _, function = PRESETS[name].partition(":")
    return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]
