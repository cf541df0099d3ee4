"""TOML text and files: reading them into dicts, writing dicts of plain values back.

Reading is ``tomllib`` (``tomli`` on Python 3.10), its errors re-raised as ``ValueError``
naming the file. Writing covers what a run config holds; tables two levels down are inline::

    text = format_toml({"seed": 0, "optim": {"lr": 0.1}, "model": {"options": {"w": 8}}})
    parse_toml(text) == {"seed": 0, "optim": {"lr": 0.1}, "model": {"options": {"w": 8}}}

Tuples read back as lists. :func:`check_value` tells whether a value can make the trip.

:func:`read_toml` reads through :func:`snens.files.read_bytes`: a regular file of at most
:data:`MAX_TOML_BYTES`, checked before a byte is read, never a FIFO; through a link only where
the caller allows it (a file given by hand, not a file in a run directory).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from snens import files

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

__all__ = [
    "MAX_TOML_BYTES",
    "TOMLDecodeError",
    "check_value",
    "format_key",
    "format_toml",
    "format_value",
    "parse_toml",
    "parse_value",
    "read_toml",
]

#: What :func:`parse_value` raises for text that is not a TOML value (a ``ValueError``).
TOMLDecodeError = tomllib.TOMLDecodeError

#: The largest TOML file :func:`read_toml` reads: a config is a few kilobytes. The same as
#: ``snens.engine.runs.MAX_FILE_BYTES`` (runs imports this module, so it is not imported here).
MAX_TOML_BYTES = 64 * 2**20

# every other control character is written as \uXXXX
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def parse_toml(text: str, source: str | os.PathLike = "<text>") -> dict[str, Any]:
    """The tables of TOML ``text`` (``source``: the file it came from, for messages).

    Raises:
        ValueError: ``text`` is not valid TOML; the message names ``source``.
    """
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{source}: not valid TOML: {error}") from error


def read_toml(
    path: str | os.PathLike,
    *,
    limit: int = MAX_TOML_BYTES,
    follow_links: bool = True,
    what: str = "TOML file (a config is a few kilobytes)",
) -> dict[str, Any]:
    """The tables of the UTF-8 TOML file at ``path`` (line endings as ``Path.read_text``), read
    only if it is a regular file of at most ``limit`` bytes, checked before a byte is read;
    through a link in its last component only with ``follow_links`` (False for a file in a run
    directory, which snens wrote itself); ``what`` names the file in messages.

    Raises:
        FileNotFoundError: nothing at ``path``.
        snens.files.FileRefusedError: an ``OSError``: a directory, FIFO, socket or device, a
            link (unless ``follow_links``), or a file above ``limit`` bytes; the message names
            the file, what it is or its size, and the fix.
        OSError: a read that failed; the message names the file.
        ValueError: the file is not UTF-8 or not valid TOML.
    """
    path = Path(path)
    try:
        data = files.read_bytes(path, limit=limit, follow_links=follow_links, what=what)
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path} not found") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path}: not valid TOML: not UTF-8 ({error.reason} at byte {error.start})"
        ) from None
    return parse_toml(text.replace("\r\n", "\n").replace("\r", "\n"), path)


def parse_value(text: str) -> Any:
    """The one TOML value ``text`` holds: ``"0.5"`` → 0.5, ``"[25, 50]"`` → [25, 50].

    Raises:
        TOMLDecodeError: ``text`` is not a TOML value (a bare word, a broken string or list).
    """
    return tomllib.loads(f"value = {text}")["value"]


def _check_utf8(text: str, key: str) -> None:
    """Refuse a lone surrogate (e.g. from a bad decode), which a UTF-8 file cannot hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{key} holds a character UTF-8 cannot encode ({error.reason} at position "
            f"{error.start}): {text!r}"
        ) from None


def check_value(value: Any, key: str) -> None:
    """Raise unless ``value`` (named ``key`` in messages) survives the trip to a TOML file
    and back: TOML scalars, lists and tables with string keys, strings encodable as UTF-8.

    Raises:
        TypeError: a value (or item) of a type TOML does not hold, e.g. None; the key named.
        ValueError: a string or key with a character UTF-8 cannot encode (a lone surrogate).
    """
    if isinstance(value, str):
        _check_utf8(value, key)
        return
    if isinstance(value, bool | int | float):
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_value(item, f"{key}[{i}]")
        return
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        for name, item in value.items():
            _check_utf8(name, f"{key} (a key)")
            check_value(item, f"{key}.{name}")
        return
    raise TypeError(
        f"{key} must be a string, number, bool, list or table (what TOML holds), got "
        f"{type(value).__name__} {value!r}"
    )


def _format_char(ch: str) -> str:
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    return f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch


def _format_string(text: str) -> str:
    return '"' + "".join(map(_format_char, text)) + '"'


def format_key(key: str) -> str:
    """``key`` as a TOML key: bare when it is ASCII letters, digits, ``_`` and ``-``, else
    quoted (``"b c"``, ``""``, ``"ключ"``)."""
    bare = key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key)
    return key if bare else _format_string(key)


def format_value(value: Any) -> str:
    """``value`` as a TOML value on one line; lists, tuples and tables inline.

    Raises:
        TypeError: ``value`` (or an item in it) is of a type TOML does not hold, e.g. None.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):  # the shortest text that reads back the same: nan, inf, 1e+300
        return repr(value)
    if isinstance(value, str):
        return _format_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        items = ", ".join(f"{format_key(k)} = {format_value(v)}" for k, v in value.items())
        return "{" + items + "}"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} to TOML")


def _format_table(table: Mapping[str, Any], header: tuple[str, ...]) -> list[str]:
    """``table``'s lines: ``[header]`` (none at the top), its scalars, then each table in it."""
    lines = ["", "[" + ".".join(format_key(k) for k in header) + "]"] if header else []
    inner = {k: v for k, v in table.items() if isinstance(v, Mapping)} if len(header) < 2 else {}
    lines += [f"{format_key(k)} = {format_value(v)}" for k, v in table.items() if k not in inner]
    for key, value in inner.items():
        lines += _format_table(value, (*header, key))
    return lines


def format_toml(values: Mapping[str, Any], comment: str = "") -> str:
    """``values`` as a TOML document, which :func:`parse_toml` reads back (tuples as lists),
    after a first line ``# comment`` unless it is "": top-level scalars first, then each table
    as ``[name]`` and each table in it as ``[name.inner]``; tables deeper down inline.

    Raises:
        TypeError: a value TOML cannot hold (named, e.g. None).
    """
    lines = [f"# {comment}"] if comment else []
    return "\n".join(lines + _format_table(values, ())) + "\n"
