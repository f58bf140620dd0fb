"""The protocol of anything that saves and loads where it stands
(``state_dict`` / ``load_state_dict``): samplers, datasets, their
iterators, the DataLoader itself, as torchdata defines it."""

from __future__ import annotations

from typing import Any, Protocol, TypeGuard, runtime_checkable

__all__ = ["Stateful", "is_stateful"]


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict(state)``: samplers,
    datasets, their iterators, the DataLoader itself (torchdata's protocol).

    Example::

        >>> from conveyor import DataLoader, Stateful
        >>> isinstance(DataLoader(list(range(4))), Stateful)
        True
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def is_stateful(obj: Any) -> TypeGuard[Stateful]:
    """Whether ``obj`` has both ``state_dict`` and ``load_state_dict``."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
