"""Ready-made weaves of third-party code (presets of ``hookwrap run --preset NAME``).

``PRESETS`` maps a preset's name to ``"module:function"``: calling the function
applies the weave and returns a handle whose ``remove()`` undoes it.
"""

from __future__ import annotations

PRESETS: dict[str, str] = {
    "torch_optim": "hookwrap.integrations.torch_optim:weave_optimizers",
}
