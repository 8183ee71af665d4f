"""What the generated decoders and encoders are built from: the parts of a descriptor after its
fixed header (as :mod:`hurray_schema.structs.walker` names them) and the :mod:`struct` formats of
their fields, split into ``pack`` calls of a bounded number of arguments."""

from __future__ import annotations

import re
import struct

from ..model import SCHEMES, TABLE_LAYOUTS, VALUE_CLASSES
from ..structs._declare import plan
from ..structs.descriptor import FIXED_HEADER
from ..structs.walker import BUFFER_PART, LAYOUT_PART, NOTHING, QUANTIZATION_PART, SECTION_PARTS, DescriptorVisitor

__all__ = ["MAX_PACK_ARGUMENTS"]


class _NotCompilable(Exception):
    """This descriptor's shape of wire data is left to the general decoder."""


_HEADER_SIZE = plan(FIXED_HEADER).fixed_size
_LAYOUT = LAYOUT_PART
_BUFFER_TABLE = BUFFER_PART
_QUANTIZATION = QUANTIZATION_PART
_SECTIONS = tuple((part.attribute, part.decl, VALUE_CLASSES[part.value_class]) for part in SECTION_PARTS)
"""``(descriptor attribute, declaration, value class)`` of each section after quantization, in wire order."""


def _items(fmt: str) -> int:
    """Number of values ``struct`` unpacks for ``fmt`` (``4Q`` is four, ``4s`` one)."""
    return len(_format_items(fmt))


MAX_PACK_ARGUMENTS = 30
"""Most values one generated ``pack`` call passes.  CPython 3.11 compiles a call with more
positional arguments than its stack-use guideline (30) into building a list of them and a
tuple from it; two calls and joining their bytes cost less than that."""

_FORMAT_TOKEN = re.compile(r"(\d*)([xcbB?hHiIlLqQnNefdspP])")


def _format_items(fmt: str) -> list:
    """The codes of ``fmt`` (a little-endian :mod:`struct` format), one per value it packs
    (``2Q`` is two ``Q``, ``4s`` one); pad bytes go with the value before them."""
    items: list = []
    lead = ""
    for count, code in _FORMAT_TOKEN.findall(fmt.lstrip("<")):
        if code == "x":
            if items:
                items[-1] += f"{count}x"
            else:
                lead += f"{count}x"
        elif code in "sp":
            items.append(f"{lead}{count}{code}")
            lead = ""
        elif count != "0":  # "0Q" (an array of rank 0) packs no value
            items.extend([lead + code] + [code] * (int(count or 1) - 1))
            lead = ""
    return items


def _pack_calls(fmt: str, args: list) -> list:
    """``(struct.Struct, argument sources)`` of each ``pack`` call that together give the
    bytes of ``fmt`` packed from ``args``, each taking at most :data:`MAX_PACK_ARGUMENTS`."""
    items = _format_items(fmt)
    if len(items) != len(args):
        raise _NotCompilable("the format and the arguments disagree")
    calls = [(struct.Struct("<" + "".join(items[i:i + MAX_PACK_ARGUMENTS])), args[i:i + MAX_PACK_ARGUMENTS])
             for i in range(0, max(len(args), 1), MAX_PACK_ARGUMENTS)]
    if sum(codec.size for codec, _ in calls) != struct.calcsize(fmt):  # pad bytes before no value at all
        raise _NotCompilable("the format has pad bytes no value carries")
    return calls


class _CompilingVisitor(DescriptorVisitor):
    """What the decoder and the encoder compilers share as visitors of the walk: its decisions
    (flags, counts, tags) come from the descriptor ``desc`` the code is compiled for, and what the
    general path keeps to itself raises :class:`_NotCompilable` -- a layout without its own value
    class (tiled, private), an unknown layout or scheme, a scheme table of variable size."""

    marks_parts = False

    def __init__(self, desc) -> None:
        self.desc = desc

    def header_values(self) -> dict:
        """The fixed-header values the walk decides by."""
        desc = self.desc
        return {"flags": desc.flags, "rank": desc.rank, LAYOUT_PART.chosen_by: desc.layout.tag}

    def part(self, part, choice=None):
        if part is LAYOUT_PART and choice is not None and choice.decl is not None:
            layout = self.desc.layout
            if TABLE_LAYOUTS.get(layout.tag) is not layout.__class__:
                raise _NotCompilable(f"layout 0x{layout.tag:02X}")
        return NOTHING

    def level(self, part, choice, depth: int):
        raise _NotCompilable("a nesting layout")

    def private(self, part, choice, context: dict) -> None:
        raise _NotCompilable("a private layout")

    def unknown(self, part, tag: int) -> None:
        raise _NotCompilable(f"{part.name} 0x{tag:02X}")

    def chosen_tag(self, part) -> int:
        return self.scheme_of(part).scheme

    def unknown_sized(self, part, tag, context: dict) -> None:
        raise _NotCompilable("unknown quantization scheme")

    def scheme_of(self, part):
        """The value class of the sized part's object (its scheme), when it is a declared one."""
        q = getattr(self.desc, part.attribute)
        cls = SCHEMES.get(getattr(q, "scheme", None))
        if cls is None or q.__class__ is not cls:
            raise _NotCompilable("unknown quantization scheme")
        return cls


def _fixed_size(decl) -> int:
    """The size of a scheme's table, which both compilers need fixed."""
    size = plan(decl).fixed_size
    if size is None:
        raise _NotCompilable("quantization table of variable size")
    return size
