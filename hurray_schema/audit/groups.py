"""The parts of an audited input that its findings are listed under: tensors and composites
with their byte spans, in byte order, and for a file its header, KV metadata, index and
trailer (``file-format.md § File Layout``), for a message stream each message
(``interchange.md § Message Framing``).

The spans are those of the annotated view (:mod:`hurray_schema.hexview`): each part comes
from the located walk of the input's kind (:mod:`hurray_schema.io.walk`, fault policy
``ANNOTATE``, permissive decode), so a damaged input still gets every part that can be
located.
"""

from __future__ import annotations

from typing import Optional

import attrs

from ..rules.engine import Mode

__all__ = ["Group", "groups_of", "group_of"]


@attrs.frozen(slots=True)
class Group:
    """One part of the input: ``label`` ("tensor 0", "composite 'w'", "file header", "message 3"
    ...), its descriptor's (or section's) bytes ``[start, end)``, its composite nesting ``depth``,
    ``text`` (element type, shape, layout; empty for a section), ``tensor`` (False for a file's
    sections and a stream's messages) and ``data_end``, where the tensor's data buffers end."""

    label: str
    start: int
    end: int
    depth: int
    text: str
    tensor: bool
    data_end: int

    def to_json(self) -> dict:
        """The group as ``audit --json`` lists it (``data_end`` is not part of the schema)."""
        return {"label": self.label, "start": self.start, "end": self.end, "depth": self.depth, "text": self.text,
                "tensor": self.tensor}


def groups_of(data, kind: str) -> tuple[Group, ...]:
    """The groups of ``data`` read as ``kind`` (descriptor, stream, messages or file), in byte
    order; none for any other kind (an input whose kind could not be told)."""
    from ..io import walk as located

    build = _BUILDERS.get(kind)
    return tuple(build(located.as_view(data), located)) if build is not None else ()


def group_of(groups, offset: Optional[int]) -> Optional[Group]:
    """The innermost tensor / composite whose descriptor holds ``offset``, else the tensor
    whose data region holds it (an offset at the very end counts as inside); None without an
    offset or when no group holds it."""
    if offset is None:
        return None
    best = None
    for g in groups:
        if g.start <= offset < g.end and (best is None or g.depth >= best.depth):
            best = g
    if best is None:
        for g in groups:
            if g.start <= offset <= g.data_end:
                best = g
    return best


def _tensor_group(label: str, desc, start: int, end: int, depth: int) -> Group:
    from ..hexview import descriptor_text

    if desc is not None and desc.is_composite_head:
        label = label.replace("tensor", "composite", 1)
    return Group(label, start, end, depth, descriptor_text(desc), True, end)


def _section_group(label: str, start: int, end: int) -> Group:
    return Group(label, start, end, 0, "", False, end)


def _with_data_end(group: Group, data_end: int) -> Group:
    return attrs.evolve(group, data_end=max(group.data_end, data_end))


def _peek(buf, base: int, depth: int):
    """The walk's descriptor step for grouping: the permissive decode and the extent the
    annotated view gives the descriptor."""
    from ..hexview import descriptor_extent, peek_descriptor
    from ..io.walk import Part

    view = memoryview(buf)
    desc, _ = peek_descriptor(view, base)
    return Part("descriptor", base, base + descriptor_extent(view), value=desc, depth=depth)


def _descriptor_groups(view, located) -> list[Group]:
    return [_tensor_group("descriptor", part.value, part.start, part.end, 0)
            for part in located.walk_descriptor(view, _peek)]


def _stream_groups(view, located) -> list[Group]:
    """A bare stream (``stream-format.md``): each descriptor, its data end moved past its buffers."""
    groups: list[Group] = []
    for part in located.walk_bare(located.Window(view), _peek, faults=located.Faults.ANNOTATE,
                                  mode=Mode.PERMISSIVE):
        if part.kind == located.DESCRIPTOR:
            groups.append(_tensor_group(f"tensor {len(groups)}", part.value, part.start, part.end, part.depth))
        elif part.kind == located.BUFFER:
            groups[-1] = _with_data_end(groups[-1], part.end)
    return groups


def _message_groups(view, located) -> list[Group]:
    """A message stream: each message, and each descriptor a TENSOR_DESCRIPTOR message carries."""
    groups: list[Group] = []
    for part in located.walk_messages(located.Window(view), _peek, faults=located.Faults.ANNOTATE,
                                      mode=Mode.PERMISSIVE):
        if part.kind == located.MESSAGE:
            groups.append(_section_group(f"message {part.index}", part.start, part.end))
        elif part.kind == located.DESCRIPTOR:
            groups.append(_tensor_group(f"tensor @{part.start}", part.value, part.start, part.end, part.depth))
    return groups


def _file_groups(view, located) -> list[Group]:
    """A file: its header, each tensor by its index entry's name (data end: the end of its data
    region within the file), the KV metadata and index sections the view can show, the trailer."""
    from ..io.file import walk as file_walk  # the file's walk lives in the file package

    groups: list[Group] = []
    size, name, tensor_at = len(view), "", None
    sections = {file_walk.KV_PART: "kv metadata", file_walk.INDEX_PART: "index"}
    for part in file_walk.walk_file(view, _peek, faults=located.Faults.ANNOTATE, mode=Mode.PERMISSIVE):
        kind = part.kind
        if kind == file_walk.FILE_HEADER_PART or kind == located.FAULT and part.decl is not None:
            groups.append(_section_group("file header", 0, part.end))
        elif kind == located.ENTRY:
            name = part.value.name
        elif kind == located.DESCRIPTOR:
            tensor_at = len(groups)
            groups.append(_tensor_group(f"tensor {name!r}", part.value, part.start, part.end, part.depth))
        elif kind == file_walk.TENSOR_DATA and tensor_at is not None:
            start = part.start
            end = min(size, part.end) if start <= size else start
            groups[tensor_at] = _with_data_end(groups[tensor_at], max(end, start))
        elif kind in sections:
            if part.start <= size and part.end - part.start <= size - part.start:  # else the view shows an error
                groups.append(_section_group(sections[kind], part.start, part.end))
        elif kind == file_walk.TRAILER_PART:
            groups.append(_section_group("trailer", part.start, part.end))
    return groups


_BUILDERS = {"descriptor": _descriptor_groups, "stream": _stream_groups, "messages": _message_groups,
             "file": _file_groups}
