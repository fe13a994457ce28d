"""JSON text as `json.dumps(value, indent=2, sort_keys=True)` writes it, made faster.

Takes: plain JSON data (dicts, lists, tuples, str, int, float, bool, None).
Returns: the very same text the standard library writes with those arguments.

The standard library encodes in C only without `indent`; with it, every value goes through
a chain of Python generators, which at 16,384 ranks spent seconds on the 17 MB report. The
C encoder takes any separators, though: a container holding no container is one line of
items, and with `",\\n" + indent` between items it is the indented text but for the line
breaks after its opening bracket and before its closing one, which are added around it.
So only containers that hold containers are walked in Python, one call each. A value the C
encoder would refuse goes back to `json.dumps` whole, so the text never differs:
`tests/test_json_text.py` compares the two on any data.
"""

from __future__ import annotations

import json
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, Callable

__all__ = ["indented_json"]

_INDENT = "  "
_CONTAINERS = frozenset((dict, list, tuple))


def _flat_encoder(item_separator: str) -> Callable[[Any], str]:
    """A one-line encoder (`sort_keys`) with these separators, in C where Python has it."""
    encoder = json.JSONEncoder(separators=(item_separator, ": "), sort_keys=True)
    if c_make_encoder is None:  # a Python without the C accelerator: the same text, slower
        return encoder.encode
    make = c_make_encoder(None, encoder.default, encode_basestring_ascii, None, ": ", item_separator,
                          True, False, True)
    return lambda value: "".join(make(value, 0))


class _Writer:
    """One text being written: an encoder per depth (their item separators carry the indent)."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self._flat: list[Callable[[Any], str]] = []

    def flat(self, depth: int) -> Callable[[Any], str]:
        """The one-line encoder of a container at `depth` whose items are not containers."""
        while len(self._flat) <= depth:
            self._flat.append(_flat_encoder(",\n" + _INDENT * (len(self._flat) + 1)))
        return self._flat[depth]

    def write(self, value: Any, depth: int) -> None:
        kind = type(value)
        if kind is dict:
            items: Any = value.values()
        elif kind is list or kind is tuple:
            items = value
        else:
            self.out.append(self.flat(depth)(value))
            return
        if not value:
            self.out.append("[]" if kind is not dict else "{}")
            return
        pad = "\n" + _INDENT * depth
        inner = pad + _INDENT
        if _CONTAINERS.isdisjoint(map(type, items)):
            text = self.flat(depth)(value)
            self.out.append(text[0] + inner + text[1:-1] + pad + text[-1])
        elif kind is dict:
            self._write_dict(value, depth, inner, pad)
        else:
            separator = "[" + inner
            for item in value:
                self.out.append(separator)
                self.write(item, depth + 1)
                separator = "," + inner
            self.out.append(pad + "]")

    def _write_dict(self, value: dict[Any, Any], depth: int, inner: str, pad: str) -> None:
        keys = list(value)
        if any(type(key) is not str for key in keys):
            raise TypeError("not a str key")  # json spells other keys its own way: let it
        keys.sort()
        out, spell_scalar = self.out, self.flat(0)
        separator = "{" + inner
        for key in keys:
            item = value[key]
            kind = type(item)
            head = separator + encode_basestring_ascii(key) + ": "
            if kind is str:
                out.append(head + encode_basestring_ascii(item))
            elif kind is int:
                out.append(head + int.__repr__(item))
            elif item is None:
                out.append(head + "null")
            elif kind in _CONTAINERS:
                out.append(head)
                self.write(item, depth + 1)
            else:
                out.append(head + spell_scalar(item))
            separator = "," + inner
        out.append(pad + "}")


def indented_json(value: Any) -> str:
    """`json.dumps(value, indent=2, sort_keys=True)`, the same text."""
    writer = _Writer()
    try:
        writer.write(value, 0)
    except (TypeError, ValueError, RecursionError):
        # Something json would spell otherwise or refuse (with its own message): let it.
        return json.dumps(value, indent=2, sort_keys=True)
    return "".join(writer.out)
