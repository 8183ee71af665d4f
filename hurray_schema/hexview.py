"""Annotated view of Hurray bytes, built from the wire-table declarations.

:func:`annotate` walks a single descriptor, a bare stream, a message stream or a
``.hrry`` file and returns a flat list of :class:`Node` s in byte order: one per section
(with its depth in the tree) and one per field, carrying its absolute byte range, raw
bytes, decoded value, wire type, our description and the spec citation -- all taken from
the ``field(...)`` declarations in :mod:`hurray_schema.structs`, decoded one field at a
time with the same fast plans the codec uses.  :func:`render_tree` and
:func:`render_hex` turn the nodes into text (``hurray-schema inspect`` / ``--hex``).

The walk is bounded: every count and length is checked against the bytes that remain
before it is used, and a field that does not fit ends the walk of its section with an
``error`` node instead of an exception.  It shows what the bytes say; judging them is
the job of ``hurray-schema audit``.
"""

from __future__ import annotations

import contextlib
import enum
import math
import struct
from typing import Any, Iterable, Optional

import attrs
import construct as c

from .docs import presence, spec_type, tag_table
from .errors import HurraySchemaError
from .model import DYNAMIC_DIMENSION, OPEN_COMPOSITE, DescriptorFlag, LayoutTag
from .structs import descriptor as D
from .structs import layouts as L
from .structs import quantization as Q
from .structs import sections as X
from .structs._declare import Field, Plan, fields, plan, select, static_offset, static_size

__all__ = ["Node", "annotate", "annotate_descriptor", "detect_kind", "render_tree", "render_hex"]


@attrs.frozen
class Node:
    """One line of the annotated view."""

    kind: str
    """``section``, ``field``, ``opaque`` (bytes without fields) or ``error``."""
    depth: int
    label: str
    start: int
    end: int
    raw: bytes = b""
    value: Any = None
    text: str = ""
    type: str = ""
    doc: str = ""
    ref: str = ""


OPAQUE_KEEP = 4096
"""Bytes of an opaque run (data, padding, unknown payload) kept in its node."""


class _Stop(Exception):
    """A field does not fit in what remains: the walk of this part ends here."""


_FIELD_PLANS: dict[int, tuple[Field, Plan]] = {}


def _field_plan(f: Field) -> Plan:
    entry = _FIELD_PLANS.get(id(f))
    if entry is None or entry[0] is not f:
        entry = _FIELD_PLANS[id(f)] = (f, Plan(c.Struct(f)))
    return entry[1]


def _render(decl_name: str, name: str, value, size: int = 4) -> str:
    """A decoded value as text, with the name of its tag where a tag table applies."""
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        if name in ("magic", "trailer_magic") or name in ("key", "name"):
            try:
                return '"' + bytes(value).decode("utf-8") + '"'
            except UnicodeDecodeError:
                pass
        if not any(value):
            return f"all zero ({len(value)} bytes)" if len(value) > 1 else "0"
        return "0x" + bytes(value).hex()
    if isinstance(value, tuple):
        if name in ("shape", "parent_shape"):
            return "[" + ", ".join("dynamic" if v == DYNAMIC_DIMENSION else str(v) for v in value) + "]"
        return "[" + ", ".join(_render(decl_name, "", v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    if "crc" in name and isinstance(value, int):
        return f"0x{value:08X}"
    tags = tag_table(decl_name, name)
    if isinstance(value, int) and tags is not None:
        if issubclass(tags, enum.IntFlag):
            names = [m.name for m in tags if value & int(m)]
            rest = value & ~sum(int(m) for m in tags)
            if rest:
                names.append(f"reserved 0x{rest:X}")
            return f"0x{value:0{2 * size}X} ({'|'.join(names) or 'none'})"
        try:
            return f"0x{value:02X} ({tags(value).name})"
        except ValueError:
            return f"0x{value:02X} (unassigned)"
    return str(value)




class _Walker:
    """Decodes tables field by field over a bounded view; offsets reported from ``base``."""

    def __init__(self, view: memoryview, base: int, nodes: list[Node]):
        self.view = view
        self.base = base
        self.nodes = nodes

    def section(self, label: str, start: int, end: int, depth: int, text: str = "", ref: str = "") -> int:
        self.nodes.append(Node("section", depth, label, self.base + start, self.base + end, text=text, ref=ref))
        return len(self.nodes) - 1

    def close(self, index: int, end: Optional[int] = None) -> None:
        """Set the end of the section node at ``index`` once its content is walked
        (``None``: as far as the nodes after it reach, when the walk stopped early)."""
        node = self.nodes[index]
        if end is None:
            absolute = max([n.end for n in self.nodes[index + 1:]] + [node.start])
        else:
            absolute = self.base + end
        self.nodes[index] = attrs.evolve(node, end=absolute)

    @contextlib.contextmanager
    def opened(self, index: int):
        """Close section ``index`` as far as its content reached if the walk stops inside it."""
        try:
            yield
        except _Stop:
            self.close(index)
            raise

    def error(self, message: str, pos: int, depth: int) -> None:
        self.nodes.append(Node("error", depth, "error", self.base + pos, self.base + pos, text=message))

    def opaque(self, label: str, pos: int, n: int, depth: int, doc: str = "", ref: str = "") -> int:
        n = max(0, min(n, len(self.view) - pos))
        raw = bytes(self.view[pos : pos + min(n, OPAQUE_KEEP)])  # data can be huge: keep a prefix
        self.nodes.append(Node("opaque", depth, label, self.base + pos, self.base + pos + n, raw=raw,
                               text=f"{n} bytes", doc=doc, ref=ref))
        return pos + n

    def table(self, decl: c.Construct, decl_name: str, pos: int, depth: int, ctx: Optional[dict] = None,
              prefix: str = "") -> tuple[dict, int]:
        """Decode every field of ``decl`` at ``pos``; raises :class:`_Stop` on a field that does not fit."""
        ctx = dict(ctx or {})
        for f in fields(decl):
            cond = presence(f)
            inner = f.subcon
            if cond is not None and not inner.condfunc(ctx):
                ctx[f.name] = None
                continue
            start = pos
            if isinstance(inner, c.Bytes) and not isinstance(inner.length, int):
                n = int(inner.length(ctx))
                if n > len(self.view) - pos:
                    self.error(f"{prefix}{f.name} needs {n} bytes, {len(self.view) - pos} remain", pos, depth)
                    raise _Stop
                value = bytes(self.view[pos : pos + n])
                pos += n
            else:
                need = self._need(f, ctx)
                if need is not None and need > len(self.view) - pos:
                    self.error(f"{prefix}{f.name} needs {need} bytes, {len(self.view) - pos} remain", pos, depth)
                    raise _Stop
                try:
                    values, pos = _field_plan(f).unpack(self.view, pos, **ctx)
                except (struct.error, KeyError, TypeError) as exc:
                    self.error(f"{prefix}{f.name} cannot be decoded: {exc}", pos, depth)
                    raise _Stop from None
                value = values[f.name]
            ctx[f.name] = value
            self.nodes.append(Node(
                "field", depth, prefix + f.name, self.base + start, self.base + pos,
                raw=bytes(self.view[start:pos]), value=value,
                text=_render(decl_name, f.name, value, pos - start),
                type=spec_type(f), doc=f.doc, ref=f.ref,
            ))
        return ctx, pos

    @staticmethod
    def _need(f: Field, ctx: dict) -> Optional[int]:
        inner = f.subcon
        if isinstance(inner, c.IfThenElse):
            inner = inner.thensubcon
        size = static_size(inner)
        if size is not None:
            return size
        if isinstance(inner, c.Array):
            count = inner.count(ctx) if callable(inner.count) else inner.count
            item = static_size(inner.subcon)
            if item is not None:
                return int(count) * item
        return None


# ------------------------------------------------------------------------------------
# One descriptor
# ------------------------------------------------------------------------------------

_LENGTH_AT = static_offset(D.FIXED_HEADER, "descriptor_length")
_LENGTH_FIELD = plan(select(D.FIXED_HEADER, "descriptor_length")).steps[0].codec
_MAGIC_LEN = len(D.MAGIC)



def _descriptor_summary(desc) -> str:
    from .model import ElementType

    try:
        dtype = ElementType(desc.type_tag).name.lower()
    except ValueError:
        dtype = f"type 0x{int(desc.type_tag):02X}"
    try:
        layout = LayoutTag(desc.layout.tag).name.lower()
    except ValueError:
        layout = f"layout 0x{int(desc.layout.tag):02X}"
    shape = _render("", "shape", tuple(desc.shape))
    text = f"{dtype} {shape} {layout}"
    if desc.is_composite_head:
        rule = _render("COMPOSITE", "composition_rule", int(desc.layout.composition_rule))
        text += f", {rule.split('(')[-1].rstrip(')').lower()} of {desc.layout.member_count}"
    else:
        n = len(desc.buffers)
        text += f", {n} buffer{'s' if n != 1 else ''}"
    return text


def annotate_descriptor(data, base: int = 0, depth: int = 0, label: str = "descriptor",
                        nodes: Optional[list[Node]] = None):
    """Annotate the descriptor at the start of ``data`` (offsets reported from ``base``).

    Returns ``(nodes, descriptor_or_None, end)`` where ``end`` is the number of bytes
    the descriptor occupies in ``data`` (``descriptor_length`` when it can be read).
    """
    from .codec import parse_descriptor

    nodes = [] if nodes is None else nodes
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    desc, problem = None, None
    try:
        desc, _ = parse_descriptor(view, mode="permissive", base=base)
    except HurraySchemaError as exc:
        problem = str(exc)
    limit = len(view)
    header_size = D.FIXED_HEADER_SIZE
    if len(view) >= header_size and bytes(view[:_MAGIC_LEN]) == D.MAGIC:
        (length,) = _LENGTH_FIELD.unpack_from(view, _LENGTH_AT)
        if header_size <= length <= len(view):
            limit = length
    w = _Walker(view[:limit], base, nodes)
    top = w.section(label, 0, limit, depth, text=_descriptor_summary(desc) if desc is not None else "undecodable",
                    ref="metadata.md § Overall Descriptor Structure")
    end = limit
    try:
        _walk_descriptor(w, depth + 1)
    except _Stop:
        pass
    if problem is not None:
        w.error(problem, limit, depth + 1)
    w.close(top, end)
    return nodes, desc, end


def _part(w: _Walker, name: str, decl, pos: int, depth: int, ctx: dict, decl_name: str) -> tuple[dict, int]:
    index = w.section(name, pos, pos, depth)
    with w.opened(index):
        values, end = w.table(decl, decl_name, pos, depth + 1, ctx)
    w.close(index, end)
    return values, end


def _walk_descriptor(w: _Walker, depth: int) -> None:
    order = dict(D.DESCRIPTOR_ORDER)
    h, pos = _part(w, "fixed_header", order["fixed_header"], 0, depth, {}, "FIXED_HEADER")
    rank, flags, tag = h["rank"], h["flags"], h["layout_tag"]
    if rank > D.MAX_RANK:
        w.error(f"rank {rank} exceeds {D.MAX_RANK}; the rest is not walked", pos, depth)
        return
    ctx = {"rank": rank}
    _, pos = _part(w, "shape", order["shape"], pos, depth, ctx, "SHAPE")
    _, pos = _part(w, "byte_offset", order["byte_offset"], pos, depth, ctx, "BYTE_OFFSET")
    pos = _walk_layout(w, tag, pos, depth, ctx)
    if pos is None:
        return
    for part, _ in D.DESCRIPTOR_ORDER[4:]:
        if part == "buffer_table":
            index = w.section("buffer_table", pos, pos, depth, ref=D.BUFFER_TABLE_REF)
            with w.opened(index):
                values, pos = w.table(D.BUFFER_COUNT, "BUFFER_COUNT", pos, depth + 1)
                for i in range(values["buffer_count"]):
                    sub = w.section(f"buffers[{i}]", pos, pos, depth + 1, ref=D.HANDLE_REF)
                    with w.opened(sub):
                        _, pos = w.table(D.BUFFER_HANDLE, "BUFFER_HANDLE", pos, depth + 2)
                    w.close(sub, pos)
            w.close(index, pos)
            continue
        flag = getattr(DescriptorFlag, f"HAS_{part.upper()}")
        if not flags & flag:
            continue
        if part == "quantization":
            pos = _walk_quantization(w, pos, depth)
        else:
            decl = getattr(X, f"{part.upper()}_SECTION")
            _, pos = _part(w, part, decl, pos, depth, ctx, f"{part.upper()}_SECTION")
    if pos < len(w.view):
        w.opaque("trailing", pos, len(w.view) - pos, depth,
                 doc="Bytes after the sections this reader knows (a newer minor version, or an error).",
                 ref="metadata.md § Version Compatibility")


def _walk_layout(w: _Walker, tag: int, pos: int, depth: int, ctx: dict) -> Optional[int]:
    try:
        known = LayoutTag(tag)
    except ValueError:
        known = None
    if known == LayoutTag.TILED:
        index = w.section("layout (tiled)", pos, pos, depth, ref=L.TILED_REF)
        level = 1
        with w.opened(index):
            while True:
                sub = w.section(f"level {level}", pos, pos, depth + 1)
                with w.opened(sub):
                    values, pos = w.table(L.TILED, "TILED", pos, depth + 2, ctx)
                w.close(sub, pos)
                if values["inner_layout"] != LayoutTag.TILED or level >= L.MAX_TILED_DEPTH:
                    break
                level += 1
        w.close(index, pos)
        return pos
    if known is not None:
        decl = L.LAYOUT_FIELDS[known]
        if decl is None:
            return pos
        name = known.name
        _, end = _part(w, f"layout ({name.lower()})", decl, pos, depth, ctx, name)
        return end
    if L.is_extension_layout(tag):
        _, end = _part(w, "layout (extension)", L.EXTENSION, pos, depth, ctx, "EXTENSION")
        return end
    w.opaque("layout (unknown, opaque)", pos, len(w.view) - pos, depth,
             doc="Unknown layout: nothing after byte_offset can be located.", ref="memory-layout.md § Layout Taxonomy")
    return None


def _walk_quantization(w: _Walker, pos: int, depth: int) -> int:
    index = w.section("quantization", pos, pos, depth, ref=Q.SECTION_REF)
    with w.opened(index):
        values, pos = w.table(Q.QUANTIZATION_LENGTH, "QUANTIZATION_LENGTH", pos, depth + 1)
        qlen = values["quantization_length"]
        end = pos + qlen
        if qlen > len(w.view) - pos:
            w.error(f"quantization_length {qlen} runs past the descriptor", pos, depth + 1)
            raise _Stop
    inner = _Walker(w.view[:end], w.base, w.nodes)
    scheme = w.view[pos] if qlen else None
    decl = Q.SCHEMES.get(scheme) if scheme is not None else None
    try:
        if decl is not None:
            name = Q.QuantScheme(scheme).name
            sub = inner.section(f"scheme ({name.lower()})", pos, pos, depth + 1)
            with inner.opened(sub):
                _, p = inner.table(decl, name, pos, depth + 2)
            inner.close(sub, p)
        else:
            _, p = inner.table(Q.QUANTIZATION_HEADER, "QUANTIZATION_HEADER", pos, depth + 1)
            p = inner.opaque("payload (unknown scheme)", p, end - p, depth + 1, ref=Q.HEADER_REF)
        if p < end:
            inner.opaque("padding", p, end - p, depth + 1, doc="Bytes after the scheme's fields.", ref=Q.SECTION_REF)
    except _Stop:
        pass
    w.close(index, end)
    return end


# ------------------------------------------------------------------------------------
# Files and streams
# ------------------------------------------------------------------------------------


def detect_kind(data) -> str:
    """``file``, ``descriptor``, ``stream`` (bare), ``messages`` or ``unknown``."""
    head = bytes(memoryview(data)[:16])
    try:
        from .structs import file as F

        if head.startswith(F.FILE_MAGIC):
            return "file"
    except ImportError:
        pass
    if head.startswith(D.MAGIC):
        if len(head) >= 10:
            (length,) = _LENGTH_FIELD.unpack_from(head, _LENGTH_AT)
            if length < len(memoryview(data)):
                return "stream"
        return "descriptor"
    try:
        from .structs import stream as S

        if len(head) >= S.MESSAGE_HEADER_SIZE:
            mtype = plan(S.MESSAGE_HEADER).unpack(head)[0]["message_type"]
            if mtype in {int(m) for m in S.MessageType}:
                return "messages"
    except ImportError:
        pass
    return "unknown"


def annotate(data, kind: Optional[str] = None) -> list[Node]:
    """Annotate ``data`` (bytes-like) as ``kind`` (detected when ``None``)."""
    kind = kind or detect_kind(data)
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if kind == "file":
        return _annotate_file(view)
    if kind == "stream":
        return _annotate_bare_stream(view)
    if kind == "messages":
        return _annotate_messages(view)
    if kind == "descriptor":
        return annotate_descriptor(view)[0]
    raise HurraySchemaError("not a Hurray descriptor, stream or file (no known magic at byte 0)")


def _annotate_bare_stream(view: memoryview) -> list[Node]:
    nodes: list[Node] = []
    w = _Walker(view, 0, nodes)
    pos, index, pending = 0, 0, []
    while pos < len(view):
        depth = _depth(pending)
        sub, desc, n = annotate_descriptor(view[pos:], base=pos, depth=depth, label=f"tensor {index}", nodes=nodes)
        if desc is None:
            break
        _arrive(pending, desc)
        pos += n
        for i, handle in enumerate(desc.buffers):
            if handle.byte_size > len(view) - pos:
                w.error(f"buffer {i} needs {handle.byte_size} bytes, {len(view) - pos} remain", pos, depth + 1)
                return nodes
            pos = w.opaque(f"buffer {i} data", pos, handle.byte_size, depth + 1, ref="buffer-protocol.md § Buffer Handle")
        index += 1
    return nodes


def _arrive(pending: list[int], desc=None) -> int:
    """Depth of the next tensor in a composite tree; ``pending`` holds the members each
    open composite still expects (innermost last) and is updated for ``desc``."""
    while pending and pending[-1] <= 0:
        pending.pop()
    depth = len(pending)
    if pending:
        pending[-1] -= 1
    if desc is not None and desc.is_composite_head and desc.layout.member_count != OPEN_COMPOSITE:
        pending.append(desc.layout.member_count)
    return depth


def _depth(pending: list[int]) -> int:
    """Depth of the next tensor: open composites, not counting those already complete on top."""
    depth = len(pending)
    while depth and pending[depth - 1] <= 0:
        depth -= 1
    return depth


def _annotate_messages(view: memoryview) -> list[Node]:
    from .structs import stream as S

    nodes: list[Node] = []
    w = _Walker(view, 0, nodes)
    pos, index = 0, 0
    while pos < len(view):
        sec = w.section(f"message {index}", pos, pos, 0, ref=S.FRAMING_REF)
        try:
            h, p = w.table(S.MESSAGE_HEADER, "MESSAGE_HEADER", pos, 1)
        except _Stop:
            break
        n = h["payload_length"]
        if n > len(view) - p:
            w.error(f"payload_length {n} runs past the end ({len(view) - p} bytes remain)", p, 1)
            break
        end = p + n
        inner = _Walker(view[:end], 0, nodes)
        try:
            if h["message_type"] == S.MessageType.TENSOR_DESCRIPTOR:
                _, desc, dn = annotate_descriptor(view[p:end], base=p, depth=1, label="descriptor", nodes=nodes)
                _, q = inner.table(S.TENSOR_DESCRIPTOR_FIELDS, "TENSOR_DESCRIPTOR_FIELDS", p + dn, 1)
                p = q
            elif h["message_type"] == S.MessageType.TENSOR_DATA:
                _, p = inner.table(S.TENSOR_DATA_HEADER, "TENSOR_DATA_HEADER", p, 1)
                p = inner.opaque("data", p, end - p, 1, ref=S.DATA_REF)
            if p < end:
                inner.opaque("payload", p, end - p, 1, ref=S.FRAMING_REF)
        except _Stop:
            pass
        w.close(sec, end)
        pos = end
        index += 1
    return nodes


def _annotate_file(view: memoryview) -> list[Node]:
    from .structs import file as F

    nodes: list[Node] = []
    w = _Walker(view, 0, nodes)
    size = len(view)
    try:
        sec = w.section("file header", 0, 0, 0, ref=F.HEADER_REF)
        header, pos = w.table(F.FILE_HEADER, "FILE_HEADER", 0, 1)
        w.close(sec, pos)
    except _Stop:
        return nodes
    if size < F.FILE_HEADER_SIZE + F.TRAILER_SIZE:
        w.error("the file is too short to hold a trailer", size, 0)
        return nodes
    tpos = size - F.TRAILER_SIZE
    tw = _Walker(view, 0, [])
    trailer, _ = tw.table(F.TRAILER, "TRAILER", tpos, 1)
    entries = _read_index(view, trailer)
    if not entries:
        entries = _scan_region(view, header, tpos)
        if entries:
            w.error("the index cannot be read: tensors found by walking the tensor region from "
                    "first_descriptor_offset (file-format.md § Descriptor Placement)", header["first_descriptor_offset"], 0)
    # tensor region in descriptor order (the write order; the index may be sorted by name)
    ordered = sorted(entries, key=lambda e: e["descriptor_offset"])
    pending: list[int] = []
    for i, e in enumerate(ordered):
        off, n = e["descriptor_offset"], e["descriptor_length"]
        if off >= size:
            w.error(f"index entry {e['name']!r} points past the end of the file", off, 0)
            continue
        depth = _depth(pending)
        _, desc, _ = annotate_descriptor(view[off:min(size, off + max(n, 0))] if n else view[off:], base=off,
                                         depth=depth, label=f"tensor {e['name']!r}", nodes=nodes)
        if desc is not None:
            d0, dl = e["data_offset"], e["data_length"]
            if dl:
                end = min(size, d0 + dl) if d0 <= size else d0
                raw = bytes(view[d0:min(end, d0 + OPAQUE_KEEP)]) if d0 < size else b""
                n_buf = len(desc.buffers)
                nodes.append(Node("opaque", depth + 1, "data", d0, max(end, d0), raw=raw,
                                  text=f"{dl} bytes in {n_buf} buffer{'' if n_buf == 1 else 's'}",
                                  ref="file-format.md § Data Buffer Placement"))
            _arrive(pending, desc)
    if trailer.get("kv_length"):
        _walk_kv(w, trailer["kv_offset"], trailer["kv_length"], F)
    _walk_index(w, trailer["index_offset"], trailer["index_length"], F)
    sec = w.section("trailer", tpos, tpos, 0, ref=F.TRAILER_REF)
    try:
        _, end = w.table(F.TRAILER, "TRAILER", tpos, 1)
        w.close(sec, end)
    except _Stop:
        pass
    return nodes


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _scan_region(view: memoryview, header: dict, end: int) -> list[dict]:
    """Pseudo index entries found by walking descriptors from ``first_descriptor_offset``:
    each descriptor on an 8-byte boundary, its buffers each on ``data_buffer_alignment``
    (``file-format.md § Descriptor Placement``, ``§ Data Buffer Placement``)."""
    from .codec import parse_descriptor
    from .structs import file as F

    align = header["data_buffer_alignment"]
    if align < 1 or align & (align - 1):
        return []
    pos, found = header["first_descriptor_offset"], []
    while pos + D.FIXED_HEADER_SIZE <= end and bytes(view[pos:pos + _MAGIC_LEN]) == D.MAGIC:
        try:
            desc, _ = parse_descriptor(view[pos:end], mode="permissive", base=pos)
        except HurraySchemaError:
            break
        n = desc.encoded_length
        data = cursor = _align(pos + n, align) if desc.buffers else pos + n
        for i, handle in enumerate(desc.buffers):
            if i:
                cursor = _align(cursor, align)
            cursor += handle.byte_size
        found.append({"name": f"@{pos}", "descriptor_offset": pos, "descriptor_length": n,
                      "data_offset": data, "data_length": cursor - data if desc.buffers else 0})
        pos = _align(cursor, F.DESCRIPTOR_ALIGNMENT)
    return found


def _read_index(view: memoryview, trailer: dict) -> list[dict]:
    from .structs import file as F

    nodes: list[Node] = []
    off, n = trailer["index_offset"], trailer["index_length"]
    if off > len(view) or n > len(view) - off:
        return []
    w = _Walker(view[: off + n], 0, nodes)
    try:
        return _index_entries(w, off, F, depth=None)
    except _Stop:
        return []


def _index_entries(w: _Walker, off: int, F, depth: Optional[int]) -> list[dict]:
    d = 1 if depth is None else depth
    values, pos = w.table(F.INDEX_COUNT, "INDEX_COUNT", off, d)
    count = values["index_entry_count"]
    entries = []
    for i in range(count):
        if pos >= len(w.view):
            w.error(f"index entry {i} starts past the index section", pos, d)
            break
        sec = w.section(f"entry {i}", pos, pos, d)
        v, pos = w.table(F.INDEX_NAME_LENGTH, "INDEX_NAME_LENGTH", pos, d + 1)
        n = v["name_length"]
        if n > len(w.view) - pos:
            w.error(f"name needs {n} bytes, {len(w.view) - pos} remain", pos, d + 1)
            raise _Stop
        name = bytes(w.view[pos:pos + n])
        w.nodes.append(Node("field", d + 1, "name", w.base + pos, w.base + pos + n, raw=name,
                            value=name, text=_render("", "name", name), type="uint8[name_length]",
                            doc="UTF-8 tensor name.", ref="file-format.md § Index Encoding"))
        pos += n
        v, pos = w.table(F.INDEX_ENTRY_FIELDS, "INDEX_ENTRY_FIELDS", pos, d + 1)
        w.close(sec, pos)
        v["name"] = name.decode("utf-8", "replace")
        entries.append(v)
    return entries


def _walk_index(w: _Walker, off: int, n: int, F) -> None:
    size = len(w.view)
    if off > size or n > size - off:
        w.error(f"index section [{off}, {off + n}) lies outside the file", min(off, size), 0)
        return
    sec = w.section("index", off, off + n, 0, ref=F.INDEX_REF)
    iw = _Walker(w.view[: off + n], 0, w.nodes)
    try:
        _index_entries(iw, off, F, depth=1)
    except _Stop:
        pass
    w.close(sec, off + n)


def _walk_kv(w: _Walker, off: int, n: int, F) -> None:
    size = len(w.view)
    if off > size or n > size - off:
        w.error(f"KV section [{off}, {off + n}) lies outside the file", min(off, size), 0)
        return
    sec = w.section("kv metadata", off, off + n, 0, ref=F.KV_REF)
    kw = _Walker(w.view[: off + n], 0, w.nodes)
    try:
        values, pos = kw.table(F.KV_COUNT, "KV_COUNT", off, 1)
        for i in range(values["kv_count"]):
            if pos >= off + n:
                kw.error(f"KV entry {i} starts past the KV section", pos, 1)
                break
            sub = kw.section(f"entry {i}", pos, pos, 1)
            v, pos = kw.table(F.KV_KEY_LENGTH, "KV_KEY_LENGTH", pos, 2)
            pos = _bytes_field(kw, "key", pos, v["key_length"], 2, "UTF-8 key.", "file-format.md § KV Section Encoding")
            v, pos = kw.table(F.KV_VALUE_TAG, "KV_VALUE_TAG", pos, 2)
            pos = _kv_value(kw, v["value_tag"], pos, 2, F)
            kw.close(sub, pos)
    except _Stop:
        pass
    w.close(sec, off + n)


def _bytes_field(w: _Walker, name: str, pos: int, n: int, depth: int, doc: str, ref: str) -> int:
    if n > len(w.view) - pos:
        w.error(f"{name} needs {n} bytes, {len(w.view) - pos} remain", pos, depth)
        raise _Stop
    raw = bytes(w.view[pos:pos + n])
    w.nodes.append(Node("field", depth, name, w.base + pos, w.base + pos + n, raw=raw, value=raw,
                        text=_render("", "key" if name in ("key", "value") else name, raw),
                        type=f"uint8[{n}]", doc=doc, ref=ref))
    return pos + n


def _kv_value(w: _Walker, tag: int, pos: int, depth: int, F) -> int:
    scalar = F.KV_SCALAR_VALUES.get(tag)
    if scalar is not None:
        _, pos = w.table(scalar, "KV_VALUE", pos, depth)
        return pos
    if tag in (F.KvTag.STRING, F.KvTag.BYTES):
        v, pos = w.table(F.KV_LENGTH_PREFIX, "KV_LENGTH_PREFIX", pos, depth)
        return _bytes_field(w, "value", pos, v["length"], depth, "Value bytes.", F.KV_TYPES_REF)
    if tag == F.KvTag.ARRAY:
        v, pos = w.table(F.KV_ARRAY_HEADER, "KV_ARRAY_HEADER", pos, depth)
        if v["element_tag"] == F.KvTag.ARRAY:
            w.error("an array's element_tag must be 0x01-0x06, not another array", pos, depth)
            raise _Stop
        for _ in range(v["element_count"]):
            if pos >= len(w.view):
                w.error("array elements run past the KV section", pos, depth)
                raise _Stop
            pos = _kv_value(w, v["element_tag"], pos, depth + 1, F)
        return pos
    w.error(f"value_tag 0x{tag:02X} is not a KV type this view knows", pos, depth)
    raise _Stop


# ------------------------------------------------------------------------------------
# Text
# ------------------------------------------------------------------------------------


def _range(node: Node) -> str:
    if node.end <= node.start:
        return f"{node.start}"
    if node.end - node.start == 1:
        return f"{node.start}"
    return f"{node.start}-{node.end - 1}"


def _hexbytes(raw: bytes, total: int, limit: int = 8) -> str:
    text = raw[:limit].hex(" ")
    if total > limit:
        text += f" …(+{total - limit})"
    return text


def _shared_refs(nodes: list[Node]) -> dict[int, str]:
    """Section index → the citation of a section: its own, else the one most of its direct
    fields share (printed once, on the section line, and left off those fields).

    One pass: a field or opaque run counts for the innermost open section one level up."""
    shared: dict[int, str] = {}
    open_sections: list[tuple[int, int, dict[str, int]]] = []  # (depth, index, ref counts)
    for i, n in enumerate(nodes):
        while open_sections and open_sections[-1][0] >= n.depth:
            _settle_ref(shared, open_sections.pop())
        if n.kind == "section":
            if n.ref:
                shared[i] = n.ref
            open_sections.append((n.depth, i, {} if not n.ref else None))
            continue
        if open_sections and open_sections[-1][0] == n.depth - 1 and n.kind in ("field", "opaque") and n.ref:
            refs = open_sections[-1][2]
            if refs is not None:
                refs[n.ref] = refs.get(n.ref, 0) + 1
    while open_sections:
        _settle_ref(shared, open_sections.pop())
    return shared


def _settle_ref(shared: dict[int, str], section: tuple) -> None:
    _depth, index, refs = section
    if refs:
        shared[index] = max(refs, key=lambda r: refs[r])


def render_tree(nodes: Iterable[Node], *, citations: bool = True) -> str:
    """Indented tree: each section with its byte range, then per field
    ``range  raw bytes  name = value  type  · citation`` (a citation every field of a
    section shares is printed once, on the section line)."""
    nodes = list(nodes)
    shared = _shared_refs(nodes) if citations else {}
    fieldw = max([len(n.label) + 2 * n.depth for n in nodes if n.kind != "section"] + [10])
    rangew = max([len(_range(n)) for n in nodes if n.kind in ("field", "opaque")] + [9]) + 2
    lines = []
    parents: list[tuple[int, str]] = []  # (depth, shared citation) of the enclosing sections
    for i, n in enumerate(nodes):
        while parents and parents[-1][0] >= n.depth:
            parents.pop()
        pad = "  " * n.depth
        if n.kind == "section":
            ref = shared.get(i, "")
            parents.append((n.depth, ref))
            extra = f"  {n.text}" if n.text else ""
            cite = f"  ({ref})" if citations and ref else ""
            size = n.end - n.start
            lines.append(f"{pad}{n.label} @{_range(n)} [{size} byte{'' if size == 1 else 's'}]{extra}{cite}")
        elif n.kind == "error":
            lines.append(f"{pad}! {n.text}")
        else:
            inherited = parents[-1][1] if parents and parents[-1][0] == n.depth - 1 else ""
            rng = _range(n) if n.end > n.start else f"{n.start} (0 bytes)"
            name = (pad + n.label).ljust(fieldw)
            value = n.text if n.kind == "field" else f"<{n.text}>"
            typ = f"  {n.type}" if n.type else ""
            cite = f"  · {n.ref}" if citations and n.ref and n.ref != inherited else ""
            lines.append(f"{rng:>{rangew}}  {_hexbytes(n.raw, n.end - n.start):<32} {name} = {value}{typ}{cite}")
    return "\n".join(lines)


def render_hex(nodes: Iterable[Node], *, width: int = 16, citations: bool = True) -> str:
    """Byte table: offset, up to ``width`` hex bytes per line, and the field they belong to."""
    lines = [f"{'offset':>8}  {' '.join(f'{i:02x}' for i in range(width))}  field = value"]
    for n in nodes:
        if n.kind == "section":
            lines.append(f"{'':>8}  {'':<{3 * width - 1}}  {'  ' * n.depth}# {n.label}" + (f" — {n.text}" if n.text else ""))
            continue
        if n.kind == "error":
            lines.append(f"{n.start:08x}  {'':<{3 * width - 1}}  ! {n.text}")
            continue
        raw = n.raw
        label = f"{'  ' * n.depth}{n.label} = {n.text if n.kind == 'field' else '<' + n.text + '>'}"
        if citations and n.ref:
            label += f"  ({n.ref})"
        if not raw:
            lines.append(f"{n.start:08x}  {'':<{3 * width - 1}}  {label} (0 bytes)")
            continue
        size = n.end - n.start
        rows = math.ceil(size / width)
        shown = rows if rows <= 4 else 3
        for r in range(shown):
            chunk = raw[r * width:(r + 1) * width]
            lines.append(f"{n.start + r * width:08x}  {chunk.hex(' '):<{3 * width - 1}}  {label if r == 0 else ''}".rstrip())
        if shown < rows:
            lines.append(f"{'':>8}  … {size - shown * width} more bytes")
    return "\n".join(lines)
