"""Enums whose values are the text backendgen shows: code compares the members, output and JSON
show the values unchanged."""

from __future__ import annotations

from enum import Enum


class TextEnum(str, Enum):
    """A str enum whose str() and format() are its value on every Python (3.12 changed format())."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)
