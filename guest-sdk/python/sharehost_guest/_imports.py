"""Renames a component's top-level imports: how a ``--wasi stub`` build keeps ``wasi:http`` and
``wasi:cli/stderr`` real. Build-time only; never imported inside a component.

componentize-py's ``--stub-wasi`` replaces every import whose name starts with ``wasi:`` with a
trapping stub, the plugin's own ``wasi:http`` imports included. So the build targets copies of
those interfaces under the package namespace ``sharehost-wasi:`` (left alone by the stubbing),
and this module then renames the component's imports back to ``wasi:`` (the interfaces are the
same text, so their types are too): the host links them as the real ones.

Written by hand because no Python package edits a component's import names, and the edit is
small: only the names in the top-level import section change (everything else refers to an
import by its index), so every other section is copied byte for byte.
"""

from __future__ import annotations

from typing import List, Tuple

_PREAMBLE = b"\x00asm\x0d\x00\x01\x00"
_IMPORT_SECTION = 10


class ComponentFormatError(ValueError):
    """The bytes are not a component this module can read (or a rename would collide)."""


def _u32(b: bytes, pos: int) -> Tuple[int, int]:
    """Reads an unsigned LEB128 u32 at ``pos``: (value, next position)."""
    value = shift = 0
    while True:
        if pos >= len(b) or shift > 28:
            raise ComponentFormatError(f"bad LEB128 at byte {pos}")
        byte = b[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _skip_leb(b: bytes, pos: int) -> int:
    """Skips a signed or unsigned LEB128 number."""
    while True:
        if pos >= len(b):
            raise ComponentFormatError("truncated LEB128")
        byte = b[pos]
        pos += 1
        if byte < 0x80:
            return pos


def _leb(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _skip_externdesc(b: bytes, pos: int) -> int:
    """Skips one ``externdesc`` (the component binary format's sort + type of an import)."""
    kind = b[pos]
    pos += 1
    if kind == 0x00:  # core module: 0x11 typeidx
        return _skip_leb(b, pos + 1)
    if kind in (0x01, 0x04, 0x05):  # func, component, instance: typeidx
        return _skip_leb(b, pos)
    if kind == 0x02:  # value: 0x00 valueidx | 0x01 valtype
        bound = b[pos]
        pos += 1
        if bound == 0x01 and 0x64 <= b[pos] <= 0x7F:
            return pos + 1  # a primitive value type is one byte
        return _skip_leb(b, pos)
    if kind == 0x03:  # type: 0x00 typeidx (eq) | 0x01 (sub resource)
        bound = b[pos]
        pos += 1
        return _skip_leb(b, pos) if bound == 0x00 else pos
    raise ComponentFormatError(f"unknown import kind 0x{kind:02x}")


def _rename_section(body: bytes, old: str, new: str, renamed: List[str]) -> bytes:
    count, pos = _u32(body, 0)
    out = bytearray(_leb(count))
    names = []
    for _ in range(count):
        tag = body[pos]
        if tag != 0x00:
            raise ComponentFormatError(f"import name form 0x{tag:02x} is not supported")
        length, start = _u32(body, pos + 1)
        name = body[start : start + length].decode("utf-8")
        end = _skip_externdesc(body, start + length)
        if name.startswith(old):
            renamed.append(name)
            name = new + name[len(old) :]
        names.append(name)
        encoded = name.encode("utf-8")
        out += b"\x00" + _leb(len(encoded)) + encoded + body[start + length : end]
        pos = end
    if pos != len(body):
        raise ComponentFormatError("import section has trailing bytes")
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ComponentFormatError(f"renaming would import {', '.join(dup)} twice")
    return bytes(out)


def rename_imports(component: bytes, old_prefix: str, new_prefix: str) -> Tuple[bytes, List[str]]:
    """The component with every top-level import named ``old_prefix...`` renamed to
    ``new_prefix...``, and the names that were renamed."""
    if not component.startswith(_PREAMBLE):
        raise ComponentFormatError("not a WebAssembly component (wrong preamble)")
    out = bytearray(_PREAMBLE)
    pos = len(_PREAMBLE)
    renamed: List[str] = []
    while pos < len(component):
        section = component[pos]
        size, start = _u32(component, pos + 1)
        body = component[start : start + size]
        if len(body) != size:
            raise ComponentFormatError(f"section {section} at byte {pos} is truncated")
        if section == _IMPORT_SECTION:
            body = _rename_section(body, old_prefix, new_prefix, renamed)
        out.append(section)
        out += _leb(len(body)) + body
        pos = start + size
    return bytes(out), renamed


def import_names(component: bytes) -> List[str]:
    """The names of the component's top-level imports, in order (for checks and tests)."""
    if not component.startswith(_PREAMBLE):
        raise ComponentFormatError("not a WebAssembly component (wrong preamble)")
    pos = len(_PREAMBLE)
    names: List[str] = []
    while pos < len(component):
        section = component[pos]
        size, start = _u32(component, pos + 1)
        if section == _IMPORT_SECTION:
            body = component[start : start + size]
            count, p = _u32(body, 0)
            for _ in range(count):
                length, s = _u32(body, p + 1)
                names.append(body[s : s + length].decode("utf-8"))
                p = _skip_externdesc(body, s + length)
        pos = start + size
    return names
