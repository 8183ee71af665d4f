"""In-memory tensors and composites handed out by the stream and file readers.

A :class:`Tensor` is a descriptor plus its buffers as zero-copy ``memoryview`` s (of
the input bytes, a read buffer, or a memory-mapped file).  A :class:`Composite` is a
composite head descriptor plus its members in binding order
(``layouts/composite.md § Binding``); a member may itself be a composite.
"""

from __future__ import annotations

import math
from typing import Iterable, Iterator, Optional, Sequence, Union

import attrs

from ..errors import CopyRequired, HurraySchemaError, NotAnArray, SpecViolation
from ..model import (
    BufferHandle, CombineOp, CompositeLayout, CompositeMember, CompositionRule, ElementType, MemberRole,
    ROW_MAJOR, Shard, TensorDescriptor,
)
from ..rules.composite import validate_preorder
from ..structs.element_types import element_type_info, element_type_of
from .array_protocol import DLPACK_CPU_DEVICE, ArrayProtocol

__all__ = ["Tensor", "SourcedTensor", "ProducedBuffer", "ProducedTensor", "Composite", "Item", "fetched", "locate_buffers", "walk", "ArrayProtocol", "DEFAULT_BUFFER_ALIGNMENT", "DLPACK_CPU_DEVICE"]

DEFAULT_BUFFER_ALIGNMENT = 64
"""``alignment`` our constructors declare in buffer handles (``buffer-protocol.md § Buffer Handle``)."""


_new_tensor = object.__new__


def _view(buf) -> memoryview:
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view

class Tensor(ArrayProtocol):
    """A tensor: its descriptor and its buffers (in buffer-table order).

    ``buffers`` are ``memoryview`` s over the bytes as read -- no copy is made.  The
    object does not check that the buffers match the descriptor; the readers do.
    """

    __slots__ = ("descriptor", "buffers", "name", "_origin")

    def __init__(self, descriptor: TensorDescriptor, buffers: Iterable = (), *, name: Optional[str] = None):
        if descriptor.is_composite_head:
            raise HurraySchemaError("a composite head is a Composite, not a Tensor")
        self.descriptor = descriptor
        self.buffers = tuple(_view(b) for b in buffers)
        self.name = name

    @classmethod
    def bound(cls, descriptor: TensorDescriptor, buffers: list) -> "Tensor":
        """The tensor a reader's composite binder hands over: ``descriptor`` is no composite
        head (the binder assembles those) and ``buffers`` are the reader's views, so neither
        is checked again (a stream read builds one per tensor)."""
        return cls.viewing(descriptor, tuple(map(_view, buffers)))

    @classmethod
    def viewing(cls, descriptor: TensorDescriptor, views: tuple) -> "Tensor":
        """:meth:`bound` where ``views`` is already a tuple of flat byte views (the stream walk's
        own slices): kept as they are."""
        tensor = _new_tensor(cls)
        tensor.descriptor = descriptor
        tensor.buffers = views
        tensor.name = None
        return tensor

    # -- convenience constructors ---------------------------------------------------
    @classmethod
    def dense(cls, type_tag, shape: Sequence[int], data=None, *, name: Optional[str] = None,
              shard: Optional[Shard] = None, **fields) -> "Tensor":
        """A row-major tensor of ``type_tag`` whose single buffer is ``data``
        (zeros when omitted); the buffer must hold exactly the packed element bytes."""
        info = element_type_info(type_tag)
        if info is None:
            raise HurraySchemaError(f"type_tag 0x{int(type_tag):02X} has no built-in size; build the descriptor yourself")
        nbytes = info.buffer_bytes(math.prod(shape))
        data = bytes(nbytes) if data is None else data
        view = _view(data)
        if len(view) != nbytes:
            raise HurraySchemaError(f"{len(view)} data bytes given, the shape needs {nbytes}")
        desc = TensorDescriptor(
            type_tag=type_tag, shape=tuple(shape), layout=ROW_MAJOR,
            buffers=(BufferHandle(nbytes, DEFAULT_BUFFER_ALIGNMENT),), shard=shard, **fields,
        )
        return cls(desc, (view,), name=name)

    @classmethod
    def from_numpy(cls, array, *, name: Optional[str] = None, shard: Optional[Shard] = None) -> "Tensor":
        """A dense row-major tensor of a NumPy array, of the element type of its dtype.

        Whole-byte types: a copy-free view of a C-contiguous little-endian array (others are
        copied first).  ``bool`` is bit-packed LSB-first (``element-types.md § Boolean Type``).
        The ``ml_dtypes`` sub-byte types (int4, uint4, int2, uint2, float4_e2m1fn,
        float6_e2m3fn, float6_e3m2fn), whose items hold one code in their low bits, are packed
        LSB-first (``element-types.md § Sub-Byte Integer Types``, ``§ 6-bit packing``)."""
        import numpy as np

        arr = np.asarray(array)
        tag = _numpy_tag(arr.dtype)
        info = element_type_info(tag)
        if tag == ElementType.BOOL:
            data = np.packbits(arr.reshape(-1), bitorder="little").tobytes()
        elif info.sub_byte:
            from ..evaluate.quantize import pack_codes  # the evaluator's packer (above io: imported here)

            data = pack_codes(np.ascontiguousarray(arr).reshape(-1).view(np.uint8), info.bit_width)
        else:
            arr = np.asarray(arr, order="C")  # np.ascontiguousarray would make a 0-d array 1-d
            if arr.dtype.byteorder == ">":
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            data = arr.reshape(-1).view(np.uint8) if arr.size else b""
        return cls.dense(tag, arr.shape, data, name=name, shard=shard)

    # -- views ---------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.descriptor.shape

    @property
    def type_tag(self):
        return self.descriptor.type_tag

    @property
    def stored_nbytes(self) -> int:
        """Bytes of the buffers as stored (codes, indices, parameters); ``nbytes`` is the decoded array's."""
        return sum(len(b) for b in self.buffers)

    @property
    def dtype(self):
        """The NumPy / ``ml_dtypes`` dtype of the decoded values (:func:`hurray_schema.evaluate.decoded_type`:
        a quantized tensor's real-valued type, a private type's raw unsigned codes)."""
        from ..evaluate import decoded_type, numpy_dtype

        return numpy_dtype(decoded_type(self.descriptor))

    def to_numpy(self, dtype=None, *, copy=None, raw: bool = False, casting: str = "unsafe", limits=None):
        """The logical array (:func:`hurray_schema.evaluate.tensor_to_numpy`, which documents the rules).

        ``dtype``: a NumPy / ``ml_dtypes`` dtype or an :class:`ElementType`; a quantized tensor
        dequantizes straight into float16 / bfloat16 / float32 / float64, any other request is a
        NumPy cast of the decoded values under ``casting`` (default ``"unsafe"``, ``astype``'s rule);
        a dtype that names no number type raises :class:`~hurray_schema.errors.InvalidDtype`.
        ``raw=True``: the stored codes (a quantized tensor's, sub-byte ones unpacked: int4 as int8).
        ``copy=None`` (default): a row-major unquantized tensor of a whole-byte type is returned as a
        read-only view of its buffer (of the memory map, for a file) -- no copy, nothing read until
        used; other tensors are decoded into a new array.  ``copy=True``: always a new, writeable
        array; ``copy=False``: the view or :class:`~hurray_schema.errors.CopyRequired`.
        An array larger than ``limits.max_evaluation_bytes`` (default 256 MiB; ``limits`` a
        :class:`~hurray_schema.Limits`) and than ``EVALUATION_EXPANSION`` times the buffers' bytes
        is refused with ``LimitExceeded`` before it is allocated.
        A quantization scale that breaks its scheme's rule (:mod:`hurray_schema.rules.values`: zero,
        not finite, a negative NF4 absmax, a reserved MXFP byte) raises that rule's
        :class:`~hurray_schema.errors.SpecViolation`, at its byte offset in the file the tensor was
        read from (``audit``'s), else with ``offset`` None."""
        from ..evaluate import tensor_to_numpy
        from ..rules.values import ScaleViolation, relocated

        try:
            return tensor_to_numpy(self.descriptor, self.buffers, dtype, copy=copy, raw=raw, casting=casting,
                                   limits=limits)
        except ScaleViolation as exc:
            raise relocated(exc, self.buffer_offsets()) from None

    def buffer_offsets(self) -> Optional[tuple]:
        """Where each buffer starts in the file it was read from (None: not read from a file)."""
        origin = getattr(self, "_origin", None)
        return None if origin is None else tuple(at for at, _ in origin[2])

    def _logical_array(self, dtype, copy):
        return self.to_numpy(dtype, copy=copy)

    def __hurray__(self):
        """The native protocol's ``"hurray_tensor"`` capsule of this tensor (``interchange.md
        § In-Process``; :mod:`hurray_schema.io.native_export`): the encoded descriptor and the
        buffers by pointer, no copy, for ``hurray.from_hurray`` or :func:`hurray_schema.from_hurray`.
        Every layout and scheme goes as it is (the consumer may refuse what it cannot read).
        Needs the hurray-ffi C ABI (:mod:`hurray_schema.io.native_abi`)."""
        from .native_export import export_capsule

        return export_capsule(self)

    def with_name(self, name: Optional[str]) -> "Tensor":
        renamed = Tensor(self.descriptor, self.buffers, name=name)
        origin = getattr(self, "_origin", None)
        if origin is not None:
            renamed._origin = origin
        return renamed

    def same_content(self, other) -> bool:
        """Same descriptor and same buffer bytes (names ignored)."""
        return (isinstance(other, Tensor) and other.descriptor == self.descriptor
                and len(other.buffers) == len(self.buffers)
                and all(a == b for a, b in zip(self.buffers, other.buffers)))

    def __repr__(self) -> str:
        tag = self.descriptor.type_tag
        tname = tag.name.lower() if isinstance(tag, ElementType) else f"0x{tag:02X}"
        label = f"{self.name!r}, " if self.name is not None else ""
        return f"Tensor({label}{tname}{list(self.shape)}, layout=0x{self.descriptor.layout_tag:02X}, {self.stored_nbytes} bytes)"

    def to_dask(self, chunks=None, *, chunk_bytes=None, limits=None):
        """The logical array as a lazy ``dask.array.Array`` (the ``[dask]`` extra), cut into
        slabs of about 64 MiB or as ``chunks`` says (:func:`hurray_schema.evaluate.dask_graph.to_dask`).
        A tensor read from a file (a path or a URL) is in the graph as its source, the file and
        its byte ranges -- the graph :meth:`HurrayFile.to_dask` builds, with no data; an in-memory
        tensor's buffers travel in the graph."""
        from ..evaluate.dask_graph import to_dask

        return to_dask(self, chunks, chunk_bytes=chunk_bytes, limits=limits, locate=locate_buffers)

    def __reduce_ex__(self, protocol):
        """A tensor read from a file pickles as its source: the file's path, size and byte ranges
        plus the descriptor (a few hundred bytes whatever the data); unpickled, it maps the same
        file again (refused if its size changed).  An in-memory tensor's memoryviews do not pickle."""
        origin = getattr(self, "_origin", None)
        if origin is None:
            return object.__reduce_ex__(self, protocol)
        path, size, ranges = origin
        return _mapped_tensor, (path, size, ranges, self.descriptor, self.name)


class SourcedTensor(Tensor):
    """A tensor of a file read by range (a URL): its buffers are fetched as reads need them.

    Indexing, :meth:`read` and ``lookup`` fetch the byte ranges the read decodes
    (:func:`hurray_schema.evaluate.region.needed_spans`); :meth:`to_numpy` and anyone taking
    :attr:`buffers` fetch whole buffers first.  Pickles as its source (:class:`~.source.SourceRef`,
    byte ranges, descriptor); dask tasks fetch their own ranges."""

    __slots__ = ("_source",)

    @classmethod
    def over(cls, descriptor: TensorDescriptor, source, *, name: Optional[str] = None) -> "SourcedTensor":
        """The tensor ``descriptor`` whose buffers ``source`` (a :class:`~.source.SourcedBuffers`) fetches."""
        tensor = _new_tensor(cls)
        tensor.descriptor, tensor._source, tensor.name = descriptor, source, name
        return tensor

    @property
    def buffers(self) -> tuple:
        """The whole buffers, fetched first if they are not all here yet."""
        self._source.ensure_all()
        return self._source.views()

    @property
    def stored_nbytes(self) -> int:
        return sum(size for _, size in self._source.ranges)

    def buffer_offsets(self) -> tuple:
        return tuple(at for at, _ in self._source.ranges)

    def with_name(self, name: Optional[str]) -> "SourcedTensor":
        return SourcedTensor.over(self.descriptor, self._source, name=name)

    def _fetched(self, lo, hi, steps):
        return fetched(self, lo, hi, steps)

    def _bare(self) -> Tensor:
        """A plain tensor over the buffers as fetched so far (for the evaluator, after the fetch)."""
        tensor = Tensor.bound(self.descriptor, self._source.views())
        tensor.name = self.name
        return tensor

    def __reduce_ex__(self, protocol):
        return _sourced_tensor, (self._source.reader.ref, self._source.ranges, self.descriptor, self.name)


WRITE_BYTES = 1 << 18
"""The largest ``write`` a :class:`ProducedBuffer` makes.  On the Linux 6.18 / ext4 machine this was
measured on, writing 1.1 GiB from memory to a new file took 0.35 s in writes of 256 or 512 KiB and
1.7-2.6 s in writes of 1 MiB (and often 4 MiB), right after a copy of the same size."""


class ProducedBuffer:
    """A buffer whose bytes are made as they are written: ``size`` bytes, which ``pieces()`` yields in order
    as byte buffers (each valid only until the next one is asked for: a producer may reuse its memory).

    The file writer (:func:`hurray_schema.write_file`) writes the pieces as they come, so a buffer made
    from an input (a converted GGUF tensor) never exists whole in memory and its bytes go to the output
    while still in the cache; anyone else taking it gets it whole (:meth:`materialized`)."""

    __slots__ = ("size", "pieces")

    def __init__(self, size: int, pieces):
        self.size = int(size)
        self.pieces = pieces

    def __len__(self) -> int:
        return self.size

    def write_to(self, write) -> None:
        """Every piece through ``write`` (a file's ``write``), in writes of at most :data:`WRITE_BYTES`;
        a producer that does not give ``size`` bytes is a bug, raised before anything follows it."""
        made = 0
        for piece in self.pieces():
            piece = memoryview(piece).cast("B")
            for start in range(0, len(piece), WRITE_BYTES):
                write(piece[start:start + WRITE_BYTES])
            made += len(piece)
        if made != self.size:
            raise HurraySchemaError(f"a produced buffer gave {made} bytes, it declared {self.size}")

    def materialized(self) -> memoryview:
        """The whole buffer, made now into memory of its own."""
        out = bytearray(self.size)
        view = memoryview(out)
        position = 0

        def copy(piece):
            nonlocal position
            piece = memoryview(piece).cast("B")
            if position + len(piece) > self.size:
                raise HurraySchemaError(f"a produced buffer gave more than the {self.size} bytes it declared")
            view[position:position + len(piece)] = piece
            position += len(piece)

        self.write_to(copy)
        return view


class ProducedTensor(Tensor):
    """A tensor whose buffers are :class:`ProducedBuffer` s, made when written.  The file writer writes
    them piece by piece; :attr:`buffers` (anyone reading the values, the stream writer) makes them whole
    first, anew at each access."""

    __slots__ = ("_produced",)

    @classmethod
    def over(cls, descriptor: TensorDescriptor, produced: Sequence[ProducedBuffer], *,
             name: Optional[str] = None) -> "ProducedTensor":
        if descriptor.is_composite_head:
            raise HurraySchemaError("a composite head is a Composite, not a Tensor")
        tensor = _new_tensor(cls)
        tensor.descriptor, tensor._produced, tensor.name = descriptor, tuple(produced), name
        return tensor

    @property
    def produced(self) -> tuple:
        """The buffers as producers (what the file writer writes)."""
        return self._produced

    @property
    def buffers(self) -> tuple:
        """The whole buffers, made now."""
        return tuple(b.materialized() for b in self._produced)

    @property
    def stored_nbytes(self) -> int:
        return sum(b.size for b in self._produced)

    def with_name(self, name: Optional[str]) -> "ProducedTensor":
        return ProducedTensor.over(self.descriptor, self._produced, name=name)


def _has_sources(item) -> bool:
    if isinstance(item, SourcedTensor):
        return True
    return isinstance(item, Composite) and any(_has_sources(member) for member in item.members)


def fetched(item, lo=None, hi=None, steps=None):
    """``item`` ready for the evaluator to read the box ``[lo, hi)`` (stepped; ``None``: all of it):
    itself when no buffer of it is read by range, else, once the byte ranges the read decodes are
    fetched (one batch of requests), a twin over the fetched buffers."""
    if not _has_sources(item):
        return item
    from ..evaluate.region import needed_spans
    from .source import fill_all

    fill_all([(leaf._source, spans) for leaf, spans in needed_spans(item, lo, hi, steps)
              if isinstance(leaf, SourcedTensor) and spans])
    return _bare(item)


def _bare(item):
    if isinstance(item, SourcedTensor):
        return item._bare()
    if isinstance(item, Composite) and _has_sources(item):
        twin = Composite.from_binder(item.descriptor, item.name, [_bare(m) for m in item.members], False)
        twin._verdict = item._verdict
        return twin
    return item


def locate_buffers(leaf):
    """Where a dask task finds ``leaf``'s buffers: the file's byte ranges
    (:class:`~hurray_schema.evaluate.dask_graph.FileBuffers`, or :class:`~.source.RemoteBuffers` for a
    URL); None for an in-memory tensor (its buffers travel in the graph)."""
    if isinstance(leaf, SourcedTensor):
        from .source import RemoteBuffers

        return RemoteBuffers(leaf._source.reader.ref, leaf._source.ranges)
    origin = getattr(leaf, "_origin", None)
    if origin is None:
        return None
    from ..evaluate.dask_graph import FileBuffers

    path, size, ranges = origin
    return FileBuffers(path, size, ranges)


_MAPS: dict = {}
"""The files this process mapped for unpickled tensors (the evaluator's dask tasks map the same way)."""


def _mapped_tensor(path: str, size: int, ranges, descriptor: TensorDescriptor, name: Optional[str]) -> Tensor:
    """The unpickled :class:`Tensor` of a file: its byte ranges of the file mapped again (refused,
    :class:`~hurray_schema.errors.SourceChanged`, when the file's size is not what it was)."""
    import os

    from ..evaluate.dask_graph import FileBuffers, mapped_buffers

    where = FileBuffers(path, size, tuple(tuple(r) for r in ranges))
    if os.stat(path).st_size != size:  # checked at every unpickling, not only when the file is first mapped
        _MAPS.pop((path, size), None)
    tensor = Tensor.bound(descriptor, list(mapped_buffers(where, _MAPS)))
    tensor.name, tensor._origin = name, (path, size, where.ranges)
    return tensor


def _sourced_tensor(ref, ranges, descriptor: TensorDescriptor, name: Optional[str]) -> SourcedTensor:
    """The unpickled :class:`SourcedTensor`: this process's reader of the same file."""
    from .source import SourcedBuffers, reader_for

    return SourcedTensor.over(descriptor, SourcedBuffers(reader_for(ref), ranges), name=name)


def _numpy_tag(dtype) -> ElementType:
    tag = element_type_of(dtype)
    if tag is None:
        raise HurraySchemaError(f"numpy dtype {dtype} has no Hurray element type here; use Tensor.dense")
    return tag


_VALID = True
"""Verdict of a composite that passed the composite binder."""


class Composite(ArrayProtocol):
    """A composite tensor: head descriptor plus members in binding order.

    A partition or an overlay is one logical array (the array protocol of :class:`ArrayProtocol`:
    ``c[index]`` reads only the members the index's box meets); a group is a collection of
    arrays: its ``shape`` and ``dtype`` are the head's advisory ones (``layouts/composite.md
    § Group``) and indexing, ``len``, ``__array__`` and ``__dlpack__`` raise
    :class:`~hurray_schema.errors.NotAnArray` (use :meth:`materialize` or ``members``).

    The evaluator only works on composites that passed the composite binder
    (:class:`hurray_schema.rules.composite.CompositeBinder`): a composite a reader bound
    cleanly is marked valid; any other one is validated by the binder on first evaluation
    (:meth:`validate`, strict mode) and the verdict is kept.
    """

    __slots__ = ("descriptor", "members", "name", "_verdict")

    def __init__(self, descriptor: TensorDescriptor, members: Iterable["Item"] = (), *, name: Optional[str] = None):
        if not descriptor.is_composite_head:
            raise HurraySchemaError("a Composite needs a head descriptor (layout_tag 0x0B)")
        self.descriptor = descriptor
        self.members = tuple(members)
        self.name = name
        self._verdict: Union[None, bool, SpecViolation] = None  # None: not validated yet
        if len(self.members) != descriptor.layout.member_count:
            raise HurraySchemaError(
                f"the head binds {descriptor.layout.member_count} members, {len(self.members)} were given")

    @classmethod
    def from_binder(cls, head: TensorDescriptor, payload, members: list, clean: bool) -> "Composite":
        """The composite the readers' binder assembled (``payload`` is the head's name in a
        file; a stream's heads have none); ``clean`` marks it as already validated."""
        composite = _new_tensor(cls)  # the binder bound a head to its member_count members: nothing to re-check
        composite.descriptor = head
        composite.members = tuple(members)
        composite.name = payload if isinstance(payload, str) else None
        composite._verdict = _VALID if clean else None
        return composite

    def validate(self) -> None:
        """Validate this composite once with the composite binder (strict; pre-order over
        the head and every member, nested composites included) and keep the verdict: raises
        the binder's :class:`~hurray_schema.errors.SpecViolation` now and on every later call.
        Offsets are None: an in-memory composite has no bytes."""
        if self._verdict is None:
            try:
                validate_preorder(node.descriptor for _name, node in walk(self))
            except SpecViolation as exc:
                self._verdict = exc
            else:
                for _name, node in walk(self):
                    if isinstance(node, Composite):
                        node._verdict = _VALID
        if self._verdict is not _VALID:
            fault = self._verdict
            raise SpecViolation(fault.rule_id, fault.citation, fault.offset, fault.message)

    @classmethod
    def build(cls, rule, members: Sequence["Item"], *, shape: Sequence[int], type_tag,
              combine_op=None, name: Optional[str] = None) -> "Composite":
        """A composite over ``members``; for an overlay the members get the Composite
        Member section (member 0 the base, the others corrections) if they lack it."""
        rule = CompositionRule(rule) if not isinstance(rule, str) else CompositionRule[rule.upper()]
        if combine_op is None:
            op = CombineOp.NONE
        else:
            op = CombineOp(combine_op) if not isinstance(combine_op, str) else CombineOp[combine_op.upper()]
        head = TensorDescriptor(
            type_tag=type_tag, shape=tuple(shape),
            layout=CompositeLayout(composition_rule=rule, member_count=len(members), combine_op=op),
        )
        members = list(members)
        if rule == CompositionRule.OVERLAY:
            for i, m in enumerate(members):
                if isinstance(m, Tensor) and m.descriptor.composite_member is None:
                    role = MemberRole.BASE if i == 0 else MemberRole.CORRECTION
                    members[i] = Tensor(attrs.evolve(m.descriptor, composite_member=CompositeMember(role)),
                                        m.buffers, name=m.name)
        return cls(head, members, name=name)

    # -- builders (layouts/composite.md § Members): shards and member sections set here --------

    @classmethod
    def partition(cls, array, *, grid=None, boxes=None, member=None, type_tag=None,
                  name: Optional[str] = None) -> "Composite":
        """A partition composite of ``array`` (``layouts/composite.md § Partition``).

        ``grid``: pieces per dimension (an int cuts dimension 0 only), the piece sizes along a
        dimension differing by at most one, the larger first (as :func:`numpy.array_split`
        cuts); or ``boxes``: ``(offset, shape)`` pairs that exactly cover the array.
        ``member(sub_array)`` builds each member, a tensor or a composite of the box's shape
        (e.g. ``lambda a: hs.quantize(a, "per_block")``; default :meth:`Tensor.from_numpy`).
        ``type_tag``: the head's logical type (default the first member's decoded type, which
        every member must share).  Each member gets the shard of its box and no Composite
        Member section; the result has passed the composite binder (strict).
        """
        import numpy as np

        arr = np.asarray(array)
        if (grid is None) == (boxes is None):
            raise HurraySchemaError("give exactly one of grid= and boxes=")
        if grid is not None:
            boxes = cls._grid_boxes(arr.shape, grid)
        else:
            boxes = [(tuple(int(o) for o in offset), tuple(int(n) for n in shape)) for offset, shape in boxes]
        build_member = Tensor.from_numpy if member is None else member
        members = []
        for offset, shape in boxes:
            region = tuple(slice(o, o + n) for o, n in zip(offset, shape))
            item = build_member(np.ascontiguousarray(arr[region]))
            if not isinstance(item, (Tensor, Composite)):
                raise HurraySchemaError(f"member= returned {type(item).__name__}, not a Tensor or a Composite")
            if tuple(item.shape) != tuple(shape):
                raise HurraySchemaError(f"member for box at {offset} has shape {tuple(item.shape)}, not {shape}")
            members.append(cls._with_sections(item, Shard(arr.shape, offset), None))
        if type_tag is None:
            type_tag = cls._decoded_type(members[0]) if members else _numpy_tag(arr.dtype)
        return cls._validated(cls.build(CompositionRule.PARTITION, members, shape=arr.shape,
                                        type_tag=cls._element_type(type_tag), name=name))

    @classmethod
    def overlay(cls, base, corrections: Iterable = (), combine_op="replace", *, type_tag=None,
                name: Optional[str] = None) -> "Composite":
        """A sealed overlay (``layouts/composite.md § Overlay``): ``base`` (a tensor, a composite or
        an array, spanning the whole view) then ``corrections`` in the order they take effect, each
        a tensor or an array, or an ``(item, offset)`` pair placing a smaller box (default offset
        all zeros).  ``combine_op``: a :class:`CombineOp` or its name.  Every member gets its shard
        and its role (base, then corrections); ``type_tag`` defaults to the base's decoded type.
        The result has passed the composite binder (strict)."""
        base_item = cls._as_item(base)
        shape = tuple(base_item.shape)
        zeros = (0,) * len(shape)
        members = [cls._with_sections(base_item, Shard(shape, zeros), MemberRole.BASE)]
        for entry in corrections:
            item, offset = entry if isinstance(entry, tuple) else (entry, zeros)
            members.append(cls._with_sections(cls._as_item(item), Shard(shape, tuple(int(o) for o in offset)),
                                              MemberRole.CORRECTION))
        if type_tag is None:
            type_tag = cls._decoded_type(base_item)
        return cls._validated(cls.build(CompositionRule.OVERLAY, members, shape=shape,
                                        type_tag=cls._element_type(type_tag), combine_op=combine_op, name=name))

    @classmethod
    def group(cls, items, *, shape: Optional[Sequence[int]] = None, type_tag=None,
              name: Optional[str] = None) -> "Composite":
        """A group composite (``layouts/composite.md § Group``) of tensors, composites or arrays (a
        mapping names its members).  Tensors keep their shard and lose any Composite Member
        section.  The head's shape and type are advisory: by default the first member's shape and
        decoded type (``(0,)`` and float32 for an empty group).  The result has passed the
        composite binder (strict)."""
        if isinstance(items, dict):
            members = [cls._as_item(value).with_name(key) for key, value in items.items()]
        else:
            members = [cls._as_item(value) for value in items]
        members = [m if isinstance(m, Composite) else cls._with_sections(m, m.descriptor.shard, None)
                   for m in members]
        first = members[0] if members else None
        if shape is None:
            shape = tuple(first.shape) if first is not None else (0,)
        if type_tag is None:
            type_tag = cls._decoded_type(first) if first is not None else ElementType.FLOAT32
        return cls._validated(cls.build(CompositionRule.GROUP, members, shape=tuple(shape),
                                        type_tag=cls._element_type(type_tag), name=name))

    @staticmethod
    def _grid_boxes(shape, grid) -> list:
        """``(offset, shape)`` boxes of a grid with ``grid[k]`` pieces along dimension ``k``, in
        row-major order of the pieces (see :meth:`partition`)."""
        import itertools

        grid = (grid,) + (1,) * (len(shape) - 1) if isinstance(grid, int) else tuple(grid)
        if len(grid) != len(shape) or any(int(pieces) < 1 for pieces in grid):
            raise HurraySchemaError(f"grid needs {len(shape)} positive piece counts")
        cuts = []
        for extent, pieces in zip(shape, grid):
            size, extra = divmod(int(extent), int(pieces))
            sizes = [size + 1] * extra + [size] * (int(pieces) - extra)
            starts = list(itertools.accumulate(sizes, initial=0))[:-1]
            cuts.append(list(zip(starts, sizes)))
        return [(tuple(start for start, _ in picks), tuple(size for _, size in picks))
                for picks in itertools.product(*cuts)]

    @staticmethod
    def _with_sections(item: "Item", shard: Optional[Shard], role) -> "Item":
        """``item`` with its shard replaced and its Composite Member section set to ``role`` (a
        tensor; None: none); a composite member keeps its members and carries no member section."""
        if isinstance(item, Composite):
            return Composite(attrs.evolve(item.descriptor, shard=shard), item.members, name=item.name)
        section = None if role is None else CompositeMember(role)
        return Tensor(attrs.evolve(item.descriptor, shard=shard, composite_member=section), item.buffers,
                      name=item.name)

    @staticmethod
    def _as_item(value) -> "Item":
        """A tensor or composite as is; anything else as a dense copy (:meth:`Tensor.from_numpy`)."""
        if isinstance(value, (Tensor, Composite)):
            return value
        import numpy as np

        return Tensor.from_numpy(np.ascontiguousarray(value))

    @staticmethod
    def _decoded_type(item: "Item"):
        """The element type ``item`` decodes to (``layouts/composite.md § Members``)."""
        from ..rules.composite import decoded_type  # the binder's definition, one layer below

        tag = decoded_type(item.descriptor)
        if tag is None:
            raise HurraySchemaError("the member's decoded type is unknown; pass type_tag=")
        return tag

    @staticmethod
    def _element_type(value) -> ElementType:
        """An :class:`ElementType` from itself, its number or its name ("float16", ...)."""
        if isinstance(value, str):
            try:
                return ElementType[value.upper()]
            except KeyError:
                raise HurraySchemaError(f"unknown element type name {value!r}") from None
        try:
            return ElementType(int(value))
        except (TypeError, ValueError):
            raise HurraySchemaError(f"{value!r} is not an element type") from None

    @staticmethod
    def _validated(composite: "Composite") -> "Composite":
        """``composite`` once the composite binder accepted it, nested members included (strict,
        ``layouts/composite.md § Validation``); its verdict is kept for the evaluator."""
        composite.validate()
        return composite

    @property
    def rule(self):
        return self.descriptor.layout.composition_rule

    @property
    def combine_op(self):
        return self.descriptor.layout.combine_op

    @property
    def shape(self) -> tuple[int, ...]:
        return self.descriptor.shape

    @property
    def type_tag(self):
        return self.descriptor.type_tag

    @property
    def dtype(self):
        """The NumPy / ``ml_dtypes`` dtype of the merged values: the head's ``type_tag`` (a private
        type: its raw unsigned codes); for a group, the head's advisory type."""
        from ..evaluate import numpy_dtype
        from ..evaluate.common import as_evaluated

        return numpy_dtype(as_evaluated(self.descriptor).type_tag)

    def _fetched(self, lo, hi, steps):
        return fetched(self, lo, hi, steps)

    def _require_array(self) -> None:
        if self.rule == CompositionRule.GROUP:
            raise NotAnArray("a group composite is a collection of its members, not one array; "
                             "use materialize() or members")

    def _logical_array(self, dtype, copy):
        from ..evaluate.tensor import DEFAULT_CASTING, requested_dtype

        self._require_array()
        if copy is False:
            raise CopyRequired("a composite's array is always evaluated from its members (copy=False was asked)")
        values = self.materialize()
        wanted = requested_dtype(dtype)
        return values if wanted is None else values.astype(wanted, casting=DEFAULT_CASTING)

    # The evaluator sits above the readers: its functions are imported at call time.

    def materialize(self, *, out=None, limits=None):
        """The merged logical array (a tuple of arrays for a group), bit-exact in the head's
        type (:func:`hurray_schema.evaluate.materialize`); refused with ``LimitExceeded``
        before allocating an array larger than both ``limits.max_evaluation_bytes`` (default
        256 MiB) and ``EVALUATION_EXPANSION`` times its members' buffers, unless the caller
        provides ``out``."""
        from ..evaluate import materialize

        return materialize(fetched(self), out=out, limits=limits)

    def lookup(self, index):
        """One element of the logical view (an integer per dimension, negative ones counting from
        the end), reading only the member that holds it.  A group has no logical view
        (``layouts/composite.md § Group``): :class:`~hurray_schema.errors.NotAnArray`, as
        for ``read``, indexing and ``__array__``."""
        from ..evaluate import lookup
        from ..evaluate.indexing import element_index

        self._require_array()
        at = element_index(index, self.shape)
        return lookup(fetched(self, at, [i + 1 for i in at]), at)

    def with_name(self, name: Optional[str]) -> "Composite":
        renamed = Composite(self.descriptor, self.members, name=name)
        renamed._verdict = self._verdict
        return renamed

    def same_content(self, other) -> bool:
        return (isinstance(other, Composite) and other.descriptor == self.descriptor
                and len(other.members) == len(self.members)
                and all(a.same_content(b) for a, b in zip(self.members, other.members)))

    def __repr__(self) -> str:
        label = f"{self.name!r}, " if self.name is not None else ""
        rule = self.rule.name.lower() if isinstance(self.rule, CompositionRule) else f"0x{self.rule:02X}"
        return f"Composite({label}{rule}, {list(self.shape)}, {len(self.members)} members)"

    def to_dask(self, chunks=None, *, chunk_bytes=None, limits=None):
        """The merged view as a lazy ``dask.array.Array`` (a tuple of them for a group; the
        ``[dask]`` extra): a partition chunked along its members' boxes, an overlay in slabs
        of about 64 MiB aligned to the base's blocks (:func:`hurray_schema.evaluate.dask_graph.to_dask`;
        a composite read from a file is in the graph as its members' sources: the graph of
        :meth:`HurrayFile.to_dask`, with no data)."""
        from ..evaluate.dask_graph import to_dask

        return to_dask(self, chunks, chunk_bytes=chunk_bytes, limits=limits, locate=locate_buffers)


Item = Union[Tensor, Composite]


def walk(item: Item, name: Optional[str] = None) -> Iterator[tuple[Optional[str], Item]]:
    """Pre-order (head first, then members) ``(name, item)`` pairs; members without a
    name get ``<parent>.<i>`` (the reference's naming)."""
    yield name, item
    if isinstance(item, Composite):
        for i, member in enumerate(item.members):
            child = member.name if member.name is not None else (None if name is None else f"{name}.{i}")
            yield from walk(member, child)
