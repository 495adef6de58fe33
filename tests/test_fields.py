"""`tracekit.model.fields.copy_fields`: one object's fields copied by name into a Struct or a
dataclass (the documents, configs and stage results built from another object's fields)."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import pytest
from msgspec import UNSET, UnsetType

from tracekit.model.fields import copy_fields, field_names


@dataclass
class Source:
    a: int
    b: list[int] = field(default_factory=list)
    renamed: str = "src"

    @property
    def doubled(self) -> int:
        return 2 * self.a

    def c(self) -> str:  # a method named like a target's field: never copied
        return "method"


class Target(msgspec.Struct, kw_only=True):
    a: int
    b: list[int]
    doubled: int
    name: str
    c: str | UnsetType = UNSET


@dataclass(frozen=True)
class Config:
    a: int = 0
    name: str = "default"
    d: float = 1.5


def test_fields_properties_and_overrides_are_copied_methods_are_not() -> None:
    src = Source(a=3, b=[1, 2])
    got = copy_fields(Target, src, name=src.renamed)
    assert got == Target(a=3, b=[1, 2], doubled=6, name="src")
    assert got.c is UNSET  # the target's default, not the bound method `Source.c`
    assert msgspec.json.encode(got) == b'{"a":3,"b":[1,2],"doubled":6,"name":"src"}'
    # a value given wins over the source's field of the same name
    assert copy_fields(Target, src, a=7, name="x").a == 7


def test_a_field_neither_gives_keeps_the_default_or_fails() -> None:
    assert copy_fields(Config, Source(a=5)) == Config(a=5, name="default", d=1.5)
    with pytest.raises(TypeError):  # `name` has no default and Source has no `name`
        copy_fields(Target, Source(a=1))


def test_a_misspelt_value_is_refused() -> None:
    with pytest.raises(TypeError, match="no field nmae"):
        copy_fields(Config, Source(a=1), nmae="x")


def test_field_names_in_declaration_order() -> None:
    assert field_names(Target) == ("a", "b", "doubled", "name", "c")
    assert field_names(Config) == ("a", "name", "d")
    with pytest.raises(TypeError):
        field_names(int)
