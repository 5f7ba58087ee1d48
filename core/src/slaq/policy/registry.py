"""A named registry of one part of the pod's policy (after the plugin registry of the Gateway API
Inference Extension's endpoint picker, which llm-d builds on): the module that defines an
implementation registers it under its name, once.

A registry is a read-only mapping from names to implementations (classes, or functions for the
ranking terms and the load), in registration order. `register` refuses a second registration under
a name already taken, naming it and both implementations: two modules claiming one name would
otherwise leave the pool's spec selecting whichever was imported last. It also refuses an
implementation that lacks a method of the part's contract (a `typing.Protocol`), naming what is
missing, so a new policy fails when its module is imported, not when a pool first selects it.
"""

from __future__ import annotations

from typing import Iterator, Mapping, TypeVar

V = TypeVar("V")


class DuplicateRegistration(ValueError):
    """A second implementation registered under a name that is already taken."""


def _name_of(implementation: object) -> str:
    module = getattr(implementation, "__module__", None)
    qualname = getattr(implementation, "__qualname__", None) or type(implementation).__qualname__
    return f"{module}.{qualname}" if module else qualname


def contract_methods(contract: type) -> tuple[str, ...]:
    """The methods a `typing.Protocol` declares itself (its public ones, and `__call__`)."""
    return tuple(name for name, value in vars(contract).items()
                 if callable(value) or isinstance(value, (classmethod, staticmethod))
                 if name == "__call__" or not name.startswith("_"))


class Registry(Mapping[str, V]):
    """Names to implementations of one policy part; `part` names it in errors, `contract` is the
    protocol each implementation (a class, for its instances, or a function) provides."""

    def __init__(self, part: str, contract: type) -> None:
        self.part = part
        self.contract = contract
        self._entries: dict[str, V] = {}

    def register(self, name: str, implementation: V) -> V:
        """Register `implementation` under `name` (returns it); a taken name or a missing method is an error."""
        if name in self._entries:
            existing = self._entries[name]
            raise DuplicateRegistration(f"{self.part} {name!r} is already registered ({_name_of(existing)}); "
                                        f"a second registration under that name ({_name_of(implementation)}) is refused")
        missing = [method for method in contract_methods(self.contract) if not callable(getattr(implementation, method, None))]
        if missing:
            raise TypeError(f"{self.part} {name!r} ({_name_of(implementation)}) does not provide {self.contract.__name__}: "
                            f"no {', '.join(missing)}")
        self._entries[name] = implementation
        return implementation

    def __getitem__(self, name: str) -> V:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"no {self.part} named {name!r} (registered: {', '.join(self._entries) or 'none'})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.part!r}, {list(self._entries)})"

