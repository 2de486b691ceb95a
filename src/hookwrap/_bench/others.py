"""The same k callbacks through other hook systems, for ratios side by side.

Each system calls k functions that take the batch and give it back, as the
hookwrap scenarios of ``hookwrap._bench`` do: pluggy (a hook with k plugins), blinker (a
signal with k receivers) and torch's ``nn.Module`` forward pre-hooks, with
hookwrap on the same module's ``forward`` beside them (a module call costs far
more than a method call, so it is compared with module calls). A system that is
not installed is left out, with the reason.
"""

from __future__ import annotations

import importlib.util
from typing import Any

SYSTEMS = ("pluggy", "blinker", "nn.Module pre-hooks", "hookwrap nn.Module forward pre")
_NEEDS = {"pluggy": "pluggy", "blinker": "blinker", "nn.Module pre-hooks": "torch",
          "hookwrap nn.Module forward pre": "torch"}


def absent() -> dict[str, str]:
    """System -> why it is left out (its package is not installed)."""
    return {system: f"{package} is not installed (pip install {package})"
            for system, package in _NEEDS.items() if importlib.util.find_spec(package) is None}


def other_scenarios(hw: Any, ks: tuple[int, ...]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Name (``"<system> k=<k>"``) -> (statement, namespace), for the systems installed."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    missing = absent()
    batch = [1, 2, 3]
    for k in ks:
        if "pluggy" not in missing:
            out[f"pluggy k={k}"] = ("hook.step(batch=batch)", {"hook": _pluggy_hook(k), "batch": batch})
        if "blinker" not in missing:
            out[f"blinker k={k}"] = ("signal.send(None, batch=batch)",
                                     {"signal": _blinker_signal(k), "batch": batch})
        if "nn.Module pre-hooks" not in missing:
            out[f"nn.Module pre-hooks k={k}"] = ("module(batch)",
                                                 {"module": _torch_hooked(k), "batch": batch})
            out[f"hookwrap nn.Module forward pre k={k}"] = (
                "module(batch)", {"module": _hookwrap_module(hw, k), "batch": batch})
    return out


def _pluggy_hook(k: int) -> Any:
    import pluggy

    spec, impl = pluggy.HookspecMarker("bench"), pluggy.HookimplMarker("bench")

    class Spec:
        @spec
        def step(self, batch: Any) -> Any: ...

    class Plugin:
        @impl
        def step(self, batch: Any) -> Any:
            return batch

    manager = pluggy.PluginManager("bench")
    manager.add_hookspecs(Spec)
    for _ in range(k):
        manager.register(Plugin())
    return manager.hook


def _blinker_signal(k: int) -> Any:
    import blinker

    signal = blinker.Signal()
    for _ in range(k):
        def receiver(sender: Any, batch: Any) -> Any:  # a distinct function each time
            return batch

        signal.connect(receiver, weak=False)
    return signal


def _torch_hooked(k: int) -> Any:
    import torch

    class Identity(torch.nn.Module):
        def forward(self, batch: Any) -> Any:
            return batch

    module = Identity()
    for _ in range(k):
        module.register_forward_pre_hook(lambda module, args: args)
    return module


def _hookwrap_module(hw: Any, k: int) -> Any:
    import torch

    class Identity(torch.nn.Module, hw.Hookable):
        @hw.hookable
        def forward(self, batch: Any) -> Any:
            return batch

    module = Identity()
    for _ in range(k):
        hw.before(module, "forward", lambda self, batch: batch)
    return module
