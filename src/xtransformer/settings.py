"""Typed settings records: one dataclass per config group, checked in one place.

Every stage's settings class derives from :class:`Settings`. Each field has a *role*:

- ``train`` (the default): changes what the stage produces; part of its cache key and of the
  model folder's training record;
- ``predict``: changes only how a trained artifact is used (beam width, top-k, post-processor);
  part of the model folder's prediction record, never of a cache key;
- ``run``: bookkeeping (display names, threads, progress bars, local paths); in neither record.

``training_settings()`` and ``prediction_settings()`` are the two records; cache keys, model
folders and loggers read them, never a hand-kept list of field names. ``from_mapping`` builds a
record from a Hydra node, rejecting unknown keys and values of the wrong type with one line that
names the key (``matcher.max_steps='abc': expected an int``); ``check`` holds each class's ranges,
choices and cross-field rules. A record's defaults are also the defaults of its config group
(``configuration.py`` generates the group's base node from them; a field's ``hydra`` metadata is the
interpolation it takes there, such as the run's ``${seed}``).
"""

from __future__ import annotations

import contextvars
import dataclasses
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, ClassVar, TypeVar

from xtransformer.errors import UserError

TRAIN, PREDICT, RUN = "train", "predict", "run"

S = TypeVar("S", bound="Settings")


class SettingsError(UserError):
    """A setting with a bad type or value; the message names the key, the value and what is allowed."""


def train_field(default: Any = dataclasses.MISSING, *, hydra: str | None = None, **kwargs: Any) -> Any:
    """A field that shapes the trained artifact: a plain default's role, spelled out to give ``hydra``."""
    return _field(TRAIN, default, hydra, kwargs)


def predict_field(default: Any = dataclasses.MISSING, *, hydra: str | None = None, **kwargs: Any) -> Any:
    """A field that only changes how a trained artifact is used (never part of a cache key)."""
    return _field(PREDICT, default, hydra, kwargs)


def run_field(default: Any = dataclasses.MISSING, *, hydra: str | None = None, **kwargs: Any) -> Any:
    """A bookkeeping field (names, threads, paths, progress): in neither record."""
    return _field(RUN, default, hydra, kwargs)


def _field(which: str, default: Any, hydra: str | None, kwargs: dict[str, Any]) -> Any:
    """``hydra``: the value the field takes in a Hydra run instead of ``default``, an interpolation
    such as ``${seed}`` (the run's seed) that the generated config node carries (configuration.py)."""
    metadata = {"role": which} | ({"hydra": hydra} if hydra is not None else {})
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def role(f: dataclasses.Field) -> str:
    return f.metadata.get("role", TRAIN)


def hydra_value(f: dataclasses.Field, value: Any) -> Any:
    """What field ``f`` holding ``value`` is in a Hydra config node: its ``hydra`` interpolation, if any."""
    return f.metadata.get("hydra", value)


class Settings:
    """Base of every settings dataclass (subclasses are ``@dataclass``)."""

    where: ClassVar[str] = ""  # the config node's Hydra path, used in messages
    error: ClassVar[type[UserError]] = SettingsError  # the package's own error class (a UserError)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # nested records given as plain mappings
            sub = _settings_class(_hints(type(self))[f.name])
            value = getattr(self, f.name)
            if sub is not None and isinstance(value, Mapping):
                setattr(self, f.name, sub.from_mapping(value, _join(self._where(), f.name)))
        self._check_types()
        self.check()

    # -------------------------------------------------------------------- construction
    @classmethod
    def from_mapping(cls: type[S], values: Mapping[str, Any] | None, where: str | None = None) -> S:
        """Build from a dict / Hydra node; unknown keys and wrong types fail naming ``where.key``."""
        where = cls.where if where is None else where
        values = dict(values or {})
        target = values.pop("_target_", None)
        if target is not None:  # the config names its record class (Hydra's convention)
            cls = _target_class(cls, target, where)
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise cls.error(
                f"unknown key(s) {[_join(where, k) for k in unknown]}; {where or 'this section'} takes {known}"
            )
        hints = _hints(cls)
        for name, value in list(values.items()):
            sub = _settings_class(hints[name])
            if sub is not None and isinstance(value, Mapping):
                values[name] = sub.from_mapping(value, _join(where, name))
        token = _WHERE.set(where)
        try:
            return cls(**values)
        finally:
            _WHERE.reset(token)

    def check(self) -> None:
        """Ranges, choices and cross-field rules (subclasses); raise through :meth:`bad`."""

    def bad(self, key: str, why: str) -> UserError:
        """The error for ``key``: ``<where>.<key>=<value>: <why>`` in the class's own error type."""
        shown = f"={getattr(self, key)!r}" if hasattr(self, key) else ""
        return self.error(f"{_join(self._where(), key)}{shown}: {why}")

    def _where(self) -> str:
        return getattr(self, "_where_", None) or _WHERE.get() or self.where

    def _check_types(self) -> None:
        self._where_ = _WHERE.get() or self.where
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            expected = _hints(type(self))[f.name]
            if not _conforms(value, expected):
                raise self.error(f"{_join(self._where(), f.name)}={value!r}: expected {_describe(expected)}")

    # -------------------------------------------------------------------- the two records
    def training_settings(self) -> dict[str, Any]:
        """What shapes the trained artifact: every ``train`` field (nested records: their own)."""
        return self._record(TRAIN)

    def prediction_settings(self) -> dict[str, Any]:
        """What only changes how the artifact is used."""
        return self._record(PREDICT)

    def _record(self, which: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Settings):  # through the public methods: subclasses refine them
                nested = value.training_settings() if which == TRAIN else value.prediction_settings()
                if nested:
                    out[f.name] = nested
            elif role(f) == which:
                out[f.name] = value
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


# records that moved when the methods became packages: configs written before still name the old place
_MOVED = {
    "xtransformer.pipeline.settings.XRLinearConfig": "xtransformer.methods.xrlinear.XRLinearConfig",
    "xtransformer.xrtransformer.XRTransformerConfig": "xtransformer.methods.xrtransformer.XRTransformerConfig",
}


def _target_class(base: type[S], target: str, where: str) -> type[S]:
    """The class a config's ``_target_`` names: ``base`` itself or a subclass of it."""
    import importlib

    module, _, name = str(target).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        moved = f" (it moved: write {_MOVED[str(target)]})" if str(target) in _MOVED else ""
        raise base.error(f"{_join(where, '_target_')}={target!r}: no such class{moved}") from None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise base.error(
            f"{_join(where, '_target_')}={target!r}: must be {base.__module__}.{base.__qualname__} or a subclass of it"
        )
    return cls


# ------------------------------------------------------------------------ type checking
# the Hydra path of the node being built, so that checks of nested records name their full key
_WHERE: contextvars.ContextVar[str] = contextvars.ContextVar("settings_where", default="")


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _settings_class(tp: Any) -> type[Settings] | None:
    for t in _union_args(tp):
        if isinstance(t, type) and issubclass(t, Settings):
            return t
    return None


def _union_args(tp: Any) -> tuple[Any, ...]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def _conforms(value: Any, tp: Any) -> bool:
    if tp is Any:
        return True
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, t) for t in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin in (list, tuple):
        (item,) = typing.get_args(tp)[:1] or (Any,)
        return isinstance(value, (list, tuple)) and all(_conforms(v, item) for v in value)
    if origin is dict:
        return isinstance(value, Mapping)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:  # an int is a fine float (1 for 1.0); a bool is not
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        parts = [_describe(t) for t in typing.get_args(tp) if t is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in typing.get_args(tp) else "")
    if origin in (list, tuple):
        (item,) = typing.get_args(tp)[:1] or (Any,)
        plural = {int: "ints", float: "numbers", bool: "booleans", str: "strings"}
        return f"a list of {plural.get(item, _describe(item))}"
    names = {int: "an int", float: "a number", bool: "true or false", str: "a string"}
    if tp in names:
        return names[tp]
    return f"a {getattr(tp, 'where', '') or getattr(tp, '__name__', str(tp))} section"


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key
