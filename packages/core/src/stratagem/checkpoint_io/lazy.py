"""A checkpoint whose costly entries are read only when a caller takes them."""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any


class _Unread:
    """Stands for an entry until it is read; never handed to a caller."""

    __slots__ = ("read",)

    def __init__(self, read: Callable[[], Any]) -> None:
        self.read = read

    def __repr__(self) -> str:
        return "<not read yet>"


class LazyCheckpoint(dict[str, Any]):
    """A checkpoint (a ``dict`` of named entries) in which some entries are read on first use.

    A reader defers what is costly and often unwanted, such as optimizer state assembled from
    shards, which evaluation never takes: ``checkpoint.defer("optimizers", read)``. Every way of
    taking a value reads it first and keeps it: ``[]``, ``get``, ``pop``, ``values``, ``items``,
    ``copy`` (also ``copy.copy`` and ``copy.deepcopy``, which return plain dicts), ``dict(checkpoint)``,
    ``{**checkpoint}``, comparison and pickling (as an ``OrderedDict``, which weights-only loading
    reads back). Key lookups (``in``, ``len``, iteration) read nothing. A read that fails raises to
    the caller who took the entry, and the entry stays unread.
    """

    def defer(self, key: str, read: Callable[[], Any]) -> None:
        """Make ``key`` an entry whose value ``read()`` returns when first taken."""
        dict.__setitem__(self, key, _Unread(read))

    def is_read(self, key: str) -> bool:
        """Whether ``key``'s value is in memory (a missing key raises ``KeyError``)."""
        return not isinstance(dict.__getitem__(self, key), _Unread)

    def unread_keys(self) -> list[str]:
        """The keys whose values have not been read."""
        return [key for key, value in dict.items(self) if isinstance(value, _Unread)]

    def read_entries(self) -> dict[str, Any]:
        """The entries already read, as a plain dict (reading nothing)."""
        return {key: value for key, value in dict.items(self) if not isinstance(value, _Unread)}

    @classmethod
    def shallow_copy(cls, checkpoint: dict[str, Any]) -> LazyCheckpoint:
        """A new checkpoint with the same entries, reading none of those still unread."""
        copied = cls()
        dict.update(copied, dict.items(checkpoint))
        return copied

    def __getitem__(self, key: str) -> Any:
        value = dict.__getitem__(self, key)
        if isinstance(value, _Unread):
            value = value.read()
            dict.__setitem__(self, key, value)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        if key not in self:
            return default
        return self[key]

    def pop(self, key: str, *default: Any) -> Any:
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        value = self[key]
        dict.__delitem__(self, key)
        return value

    def popitem(self) -> tuple[str, Any]:
        if not self:
            raise KeyError("popitem(): checkpoint is empty")
        key = next(reversed(dict.keys(self)))
        return key, self.pop(key)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            dict.__setitem__(self, key, default)
        return self[key]

    def read_all(self) -> None:
        """Read every entry still unread."""
        for key in self.unread_keys():
            self[key]

    def values(self) -> Any:
        self.read_all()
        return dict.values(self)

    def items(self) -> Any:
        self.read_all()
        return dict.items(self)

    def copy(self) -> dict[str, Any]:
        self.read_all()
        return dict(dict.items(self))

    def __copy__(self) -> dict[str, Any]:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return copy.deepcopy(self.copy(), memo)

    def __iter__(self) -> Iterator[str]:
        # Defined so that dict(checkpoint), {**checkpoint} and dict.update(checkpoint) take values
        # through __getitem__ instead of copying the storage, unread entries included.
        return dict.__iter__(self)

    def __eq__(self, other: object) -> bool:
        self.read_all()
        if isinstance(other, LazyCheckpoint):
            other.read_all()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __or__(self, other: Any) -> Any:
        return self.copy() | other

    def __ror__(self, other: Any) -> Any:
        return dict(other) | self.copy()

    def __reduce__(self) -> tuple[Any, ...]:
        # An OrderedDict of the entries: what torch.load(weights_only=True) reads back; this class is not.
        return (OrderedDict, (), None, None, iter(self.items()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"
