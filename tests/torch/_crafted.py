"""A crafted pickle: unpickling it opens (creates) ``marker``, as any code could run.
Module-level, so pickle finds it by reference."""

from __future__ import annotations

from typing import Any


class OpensAFile:
    def __init__(self, marker: Any) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> Any:
        return (open, (self.marker, "w"))
