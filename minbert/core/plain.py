"""Plain settings data: frozen dataclasses read from JSON, and back.

A job's settings reach the code that computes as plain, frozen data (minbert.core.settings), read
from the job file by `read`: no schema library, no validators. The params' models check a setting
when the planner resolves it (minbert.params); what `read` checks is only what keeps a file edited
by hand, or a model file of another version, from being half read: every key is a field of its
class (a one-line `SettingsProblem` naming the key otherwise), every field is given (or has a
default), and each value has its field's type (`int`, `float`, `bool`, `str`, `X | None`,
`tuple[X, ...]`, `Mapping[str, X]`, a nested dataclass, `Any`: JSON as it is, frozen).

A class may keep keys that are no field under one field of its own (`EXTRA = "named_heads"`: the
heads settings' `<task>: <head>` keys), and name fields a job file leaves out when they are empty
(`OMIT_EMPTY`); `as_json` writes them back as the job file holds them.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from functools import lru_cache
from typing import Any


class SettingsProblem(ValueError):
    """A setting that cannot be read: `key` is its dotted name (`finetune.heads.dropout`)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


class FrozenMap(Mapping):
    """A read-only mapping (types.MappingProxyType's behaviour) that can be copied and pickled, as a
    model holding its settings is when SMART makes its momentum copy."""
    __slots__ = ("_data",)

    def __init__(self, data=()):
        object.__setattr__(self, "_data", dict(data))

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __setattr__(self, name, value):
        raise AttributeError("a FrozenMap is read-only")

    def __reduce__(self):
        return (FrozenMap, (self._data,))

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


@lru_cache(maxsize=None)
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def read(cls, data, key: str = ""):
    """`data` (JSON types) as an instance of the dataclass `cls`, checked as the module says."""
    if not isinstance(data, Mapping):
        raise SettingsProblem(key or "settings", f"expected a mapping of settings, got {type(data).__name__}")
    hints, extra = _hints(cls), getattr(cls, "EXTRA", None)
    names = [f.name for f in dataclasses.fields(cls) if f.init and f.name != extra]
    unknown = [k for k in data if k not in names]
    if unknown and extra is None:
        raise SettingsProblem(_join(key, str(unknown[0])), f"unknown setting of {cls.__name__}")
    values = {n: _value(hints[n], data[n], _join(key, n)) for n in names if n in data}
    missing = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in values and f.name != extra
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise SettingsProblem(_join(key, missing[0]), f"missing setting of {cls.__name__}")
    if extra is not None:
        values[extra] = _value(hints[extra], {k: data[k] for k in unknown}, key)
    return cls(**values)


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _value(hint, value, key: str):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = []
        for alternative in (a for a in args if a is not type(None)):
            try:
                return _value(alternative, value, key)
            except SettingsProblem as e:
                problems.append(str(e))
        raise SettingsProblem(key, " or ".join(dict.fromkeys(problems)))
    if hint is Any:
        return frozen(value)
    if dataclasses.is_dataclass(hint):
        return read(hint, value, key)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise SettingsProblem(key, f"expected a list, got {type(value).__name__}")
        return tuple(_value(args[0], v, f"{key}.{i}") for i, v in enumerate(value))
    if origin is Mapping or origin is dict:
        if not isinstance(value, Mapping):
            raise SettingsProblem(key, f"expected a mapping, got {type(value).__name__}")
        return FrozenMap({str(k): _value(args[1], v, _join(key, str(k))) for k, v in value.items()})
    return _scalar(hint, value, key)


def _scalar(hint, value, key: str):
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint in (int, str, bool) and isinstance(value, hint) and (hint is bool or not isinstance(value, bool)):
        return value
    raise SettingsProblem(key, f"expected {getattr(hint, '__name__', hint)}, got {value!r:.60}")


def frozen(value):
    """JSON as it is, frozen: mappings read-only, lists tuples."""
    if isinstance(value, Mapping):
        return FrozenMap({k: frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


def as_json(value):
    """Plain settings (or the params' models, which dump themselves) as JSON types, the form a job
    file holds them in: a class's `EXTRA` keys beside its fields."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        extra, omitted = getattr(value, "EXTRA", None), getattr(value, "OMIT_EMPTY", ())
        out = {f.name: as_json(getattr(value, f.name)) for f in dataclasses.fields(value)
               if f.name != extra and not (f.name in omitted and not getattr(value, f.name))}
        return {**out, **(as_json(getattr(value, extra)) if extra else {})}
    if isinstance(value, Mapping):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_json(v) for v in value]
    return value


def changed(value, **changes):
    """`value` with some fields changed: plain settings by `dataclasses.replace`, a params model by
    its own copy."""
    if hasattr(value, "model_copy"):
        return value.model_copy(update=changes)
    return dataclasses.replace(value, **changes)
