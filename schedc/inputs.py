"""The one reader of every file schedc takes as input: problem files, schedule files, ablation
configs, torch CSVs and measured traces all come through here.

A file is read only if it is a regular file no larger than a cap (a named pipe, a device or a
directory is refused before anything is read), decoded as UTF-8 with a clear error, and parsed
strictly: YAML without duplicate keys, JSON without duplicate keys or NaN/Infinity. Parsed YAML
is then walked once with a bound on nesting depth and on the number of values, which also stops
YAML alias bombs (a few hundred bytes whose aliases expand to billions of values); JSON has no
aliases, and its nesting is bounded on the text before it is parsed (a walk over a large schedule
file's million values would cost more than the parse). Every number must be finite and of a sane
magnitude. Field-level rules (positive costs, booleans that are not numbers, ranges) belong to the
models that validate the data afterwards.

Every error is raised as the caller's error class (a SchedcError) with a one-line message; the
offending value is cut to a few dozen characters (``shorten``), a message to a few hundred
(``one_line``).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from schedc.errors import SchedcError

MAX_TEXT_BYTES = 4 * 2**20  # problem files, ablation configs, torch CSVs
MAX_DATA_BYTES = 256 * 2**20  # schedule files and measured traces (they list every instruction)
MAX_DEPTH = 64  # nesting of mappings and lists
MAX_INT = 10**15  # no count or id schedc reads comes near this
MAX_MESSAGE = 300  # characters of an error message
MAX_VALUE = 60  # characters of a value quoted in one


def shorten(value: Any, limit: int = MAX_VALUE) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters (huge values are not rendered)."""
    if isinstance(value, (list, tuple, dict, set)) and len(value) > limit:
        return f"<{type(value).__name__} of {len(value)} items>"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"<integer of about {int(value.bit_length() * 0.30103)} digits>"
    if isinstance(value, str) and len(value) > 4 * limit:
        value = value[: 4 * limit]
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"<{type(value).__name__}>"
    return one_line(text, limit)


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` with whitespace runs collapsed, control characters escaped, at most ``limit``
    characters (a terminal prints it as it is: no escape sequences, no second line)."""
    text = " ".join(str(text)[: 8 * limit].split())
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,119}")


def refuse_unsafe_name(name: str) -> str:
    """``name`` if it can be a file name as it is (letters, digits, ``. _ + = -``, not starting
    with a dot, at most 120 characters: no path, no hidden file, no terminal escapes)."""
    if not _SAFE_NAME.fullmatch(name):
        raise ValueError(
            f"{shorten(name)} cannot be a file name: use letters, digits and . _ + = - (not first), at most 120"
        )
    return name


def safe_filename(text: str) -> str:
    """``text`` as a safe file name (see ``refuse_unsafe_name``): other characters become ``_``."""
    name = re.sub(r"[^A-Za-z0-9._+=-]", "_", text)[:120]
    return name if _SAFE_NAME.fullmatch(name) else ("x" + name)[:120]


def read_text(path: str | Path, *, error: type[SchedcError] = SchedcError, what: str = "input file",
              max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes`` bytes; ``error`` otherwise."""
    name = one_line(str(path), 120)
    try:
        info = os.stat(path)
    except (OSError, ValueError) as e:
        raise error(f"{name}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise error(f"{name}: cannot read it as a {what}: {kind}")
    if info.st_size > max_bytes:
        raise error(f"{name}: {info.st_size} bytes, more than the {max_bytes} a {what} may have")
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise error(f"{name}: cannot read: {e.strerror or e}") from None
    if len(raw) > max_bytes:  # grew while read
        raise error(f"{name}: more than the {max_bytes} bytes a {what} may have")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{name}: not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r}): is it a {what}?") from None


def parse_json(text: str, *, source: str, error: type[SchedcError] = SchedcError) -> Any:
    """Strict JSON: no duplicate keys, no NaN/Infinity, bounded depth, numbers and size."""
    raw = text.encode()  # (UTF-8: no byte of a multi-byte character is an ASCII bracket, quote or digit)
    if _nesting(raw) > MAX_DEPTH:  # (before parsing: a walk of the text costs less than one of the values)
        raise error(f"{_name(source)}: nested deeper than {MAX_DEPTH} levels")
    # Integers are read by int() itself unless the text may hold one too long for schedc (a run of
    # 17 digits not after a decimal point): a hook per integer costs a large schedule file a second.
    ints = {"parse_int": _json_int} if _LONG_INT in b" " + raw.translate(_DIGITS) else {}
    del raw  # (a large file's copy: not held while parsing)
    try:
        data = json.loads(text, object_pairs_hook=_json_object_hook(), parse_constant=_json_constant,
                          parse_float=_json_float, **ints)
    except _Refused as e:
        raise error(f"{_name(source)}: {e}") from None
    except json.JSONDecodeError as e:
        raise error(f"{_name(source)}: not valid JSON, truncated or corrupt? ({one_line(e.msg, 80)}"
                    f" at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise error(f"{_name(source)}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:
        raise error(f"{_name(source)}: not valid JSON ({one_line(e, 120)})") from None
    # JSON has no aliases, and its parser has checked every number and the nesting was bounded first.
    return data


def parse_yaml(text: str, *, source: str, error: type[SchedcError] = SchedcError) -> Any:
    """Strict YAML (the safe subset; no duplicate keys), bounded as ``parse_json``."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except _Refused as e:
        raise error(f"{_name(source)}: {e}") from None
    except yaml.YAMLError as e:
        raise error(f"{_name(source)}: not valid YAML: {one_line(e, 200)}") from None
    except RecursionError:
        raise error(f"{_name(source)}: nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, TypeError, OverflowError) as e:  # e.g. an integer of thousands of digits
        raise error(f"{_name(source)}: not valid YAML ({one_line(e, 120)})") from None
    return checked(data, source=source, error=error, budget=len(text) + 64)


def read_data(path: str | Path, *, error: type[SchedcError] = SchedcError, what: str = "input file",
              max_bytes: int = MAX_TEXT_BYTES, fmt: str | None = None) -> Any:
    """A JSON (``.json``, or ``fmt="json"``) or YAML file, read and parsed by the rules above."""
    text = read_text(path, error=error, what=what, max_bytes=max_bytes)
    if (fmt or ("json" if Path(path).suffix.lower() == ".json" else "yaml")) == "json":
        return parse_json(text, source=str(path), error=error)
    return parse_yaml(text, source=str(path), error=error)


def checked(data: Any, *, source: str, error: type[SchedcError] = SchedcError, budget: int = 10**7) -> Any:
    """``data`` after a walk that bounds its depth and its number of values (``budget``; aliases
    count each time they are reached) and refuses non-finite or huge numbers. Where a value sits
    is kept as a chain of (parent, key) and written out only for an error."""
    stack: list[tuple[Any, int, tuple | None]] = [(data, 0, None)]
    seen = 0
    while stack:
        value, depth, where = stack.pop()
        seen += 1
        if seen > budget:
            raise error(f"{_name(source)}: expands to more than {budget} values, far more than its size"
                        " (YAML aliases?)")
        if depth > MAX_DEPTH:
            raise error(f"{_name(source)}: nested deeper than {MAX_DEPTH} levels (at {_where(where) or 'the top'})")
        if isinstance(value, dict):
            stack.extend((item, depth + 1, (where, key)) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((item, depth + 1, (where, i)) for i, item in enumerate(value))
        elif isinstance(value, bool) or value is None or isinstance(value, str):
            continue
        elif isinstance(value, int):
            if abs(value) > MAX_INT:
                raise error(f"{_name(source)}: {_where(where) or 'value'}: integer {shorten(value)} is out of range"
                            f" (at most {MAX_INT:.0e})")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise error(f"{_name(source)}: {_where(where) or 'value'}: must be a finite number, got {value}")
    return data


_PAIRED = re.compile(rb"\[\]|\{\}")  # an innermost pair, once strings and all else are gone
_NOT_STRUCTURE = bytes(set(range(256)) - set(b'[]{}"'))
# each digit to "0", "." kept, any other byte to " ": an integer of 17 digits or more shows as _LONG_INT
_DIGITS = bytes(ord("0") if chr(c).isascii() and chr(c).isdigit() else c if chr(c) == "." else ord(" ")
                for c in range(256))
_LONG_INT = b" " + b"0" * 17


def _nesting(raw: bytes) -> int:
    """How deep the brackets of ``raw`` (a JSON text's UTF-8) nest, strings left out, counted to
    MAX_DEPTH + 1 at most: each pass of a substitution takes the innermost pairs away. Text that is
    not JSON may give any count; the parser refuses it afterwards."""
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")  # escaped backslashes, then escaped quotes
    # Quotes now alternate open, close: drop the empty strings (most of them), then the rest.
    raw = re.sub(rb'"[^"]*"', b"", raw.translate(None, _NOT_STRUCTURE).replace(b'""', b""))
    depth = 0
    while raw and depth <= MAX_DEPTH:
        inner = _PAIRED.sub(b"", raw)
        if len(inner) == len(raw):  # unbalanced: not JSON
            break
        raw, depth = inner, depth + 1
    return depth


def _where(chain: tuple | None) -> str:
    """A (parent, key) chain of ``checked`` as a path: ``memory.F[2]`` (keys shortened)."""
    parts: list[str] = []
    while chain is not None:
        chain, key = chain
        parts.append(f"[{key}]" if isinstance(key, int) else f".{shorten(key, 30)}")
    return "".join(reversed(parts)).removeprefix(".")


class _Refused(ValueError):
    """Raised inside the parsers; re-raised as the caller's error with the source named."""


def _name(source: str) -> str:
    return one_line(source, 120)


def _json_object_hook():
    """A mapping from its key-value pairs, refusing a key written twice. String values are kept
    once per text (a schedule file repeats "F", "SEND" and "act" a million times)."""
    strings: dict[str, str] = {}
    keep = strings.setdefault

    def mapping(pairs: list[tuple[str, Any]]) -> dict:
        out = dict(pairs)
        for key, value in pairs:
            if value.__class__ is str:
                out[key] = keep(value, value)
        if len(out) != len(pairs):  # a key written twice (the last kept): name the first
            seen: set[str] = set()
            key = next(key for key, _ in pairs if key in seen or seen.add(key))
            raise _Refused(f"duplicate key {shorten(key)}")
        return out

    return mapping


def _json_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a number schedc accepts (numbers must be finite)")


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{shorten(text)} is not a number schedc accepts (numbers must be finite)")
    return value


def _json_int(text: str) -> int:
    if len(text) > 16 and len(text.lstrip("-")) > 16:
        raise _Refused(f"integer of {len(text)} digits is out of range (at most {MAX_INT:.0e})")
    return int(text)


class _StrictLoader(yaml.SafeLoader):
    """The safe loader, refusing a key written twice in one mapping (PyYAML keeps the last), and
    reading ``1e-3`` as a number (YAML 1.1 wants ``1.0e-3``; a string would be a baffling error)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            keys = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in keys
                except TypeError:
                    continue  # unhashable: the base loader reports it
                if duplicate:
                    line = key_node.start_mark.line + 1
                    raise _Refused(f"duplicate key {shorten(key)} (line {line})")
                keys.add(key)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
