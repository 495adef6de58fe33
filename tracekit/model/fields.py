"""One object's fields copied into another type by name: `copy_fields(Doc, obj, renamed=...)`.

A result's `document()`, a command's config handed to a stage's config, a stage's output handed to
the next: each builds a msgspec Struct or a dataclass whose fields are mostly the attributes of the
same names on another object. `copy_fields` is that assembly written once; what a call spells out is
only what differs (a field named otherwise, a value converted, one the source lacks)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


def field_names(type_: type) -> tuple[str, ...]:
    """The constructor's field names of a msgspec Struct or a dataclass, in declaration order."""
    if isinstance(type_, type) and issubclass(type_, msgspec.Struct):
        return tuple(type_.__struct_fields__)
    if dataclasses.is_dataclass(type_):
        return tuple(f.name for f in dataclasses.fields(type_) if f.init)
    raise TypeError(f"{type_.__name__} is neither a msgspec Struct nor a dataclass")


def _holds(src: object, name: str) -> bool:
    """Whether `name` is a value of `src`: one of its fields, an instance attribute or a property
    (never a method: a field of the target named like one of the source's methods is not a copy)."""
    if isinstance(getattr(type(src), name, None), (property, functools.cached_property)):
        return True
    if isinstance(src, msgspec.Struct) or dataclasses.is_dataclass(src):
        return name in field_names(type(src))
    return name in getattr(src, "__dict__", ())


def copy_fields(type_: type[T], src: object, /, **values: Any) -> T:
    """A `type_` whose fields are `values` where given, else `src`'s value of the same name (its
    field, attribute or property); a field that neither gives keeps the type's default (none: the
    constructor's TypeError). A value given that `type_` has no field for is refused, so a misspelt
    name fails where it is written."""
    names = field_names(type_)
    unknown = set(values) - set(names)
    if unknown:
        raise TypeError(f"{type_.__name__} has no field {', '.join(sorted(unknown))}")
    kwargs = {
        n: values[n] if n in values else getattr(src, n) for n in names if n in values or _holds(src, n)
    }
    return type_(**kwargs)
