"""A name -> entry registry, so adding a loss, pruner or controller is one registration: the entry carries what
the rest of the code needs to know of it (a pruner's capabilities, a loss's defaults), never a list kept elsewhere."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to entries; `get` names the valid choices when a name is unknown."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; choose one of {sorted(self._entries)}") from None

    def names(self, where: Callable[[T], bool] | None = None) -> list[str]:
        """The registered names, sorted; `where`: only those whose entry it holds for (a capability)."""
        return sorted(name for name, entry in self._entries.items() if where is None or where(entry))

    def __contains__(self, name: object) -> bool:
        return name in self._entries
