"""Import through the native protocol: :func:`from_hurray`, and composites member by member.

``from_hurray(obj)`` calls ``obj.__hurray__()`` (a ``hurray.Tensor``, one of our tensors, any
producer) and consumes the ``"hurray_tensor"`` capsule it returns, in the order the reference
runtime's ADR-034 § 4 and ``interchange.md § In-Process`` set:

1. the capsule's name: ``"used_hurray_tensor"`` is :class:`~hurray_schema.errors.CapsuleConsumed`,
   any other :class:`~hurray_schema.errors.CapsuleError`; a null list or context too;
2. the context's ABI version, before any other accessor: it must be the loaded library's
   (:class:`~hurray_schema.errors.AbiVersionMismatch`);
3. the descriptor bytes, decoded and checked by the one decoder every reader uses
   (:func:`hurray_schema.codec.decode_descriptor`, strict unless ``mode=`` says otherwise): a
   rule broken raises the :class:`~hurray_schema.errors.SpecViolation` -- rule id, citation and
   offset into the descriptor bytes -- that ``audit`` reports first for the same bytes; the bytes must be one
   whole descriptor (its ``descriptor_length``, :class:`~hurray_schema.errors.CapsuleError`);
4. the buffers: as many as the buffer table declares, each with a non-null data pointer when it
   has bytes, at least the table's ``byte_size`` long, host-readable (CPU device tag)
   (:class:`~hurray_schema.errors.CapsuleBufferError`).

Nothing is taken until all four pass: a refused capsule keeps its name, so its producer's
destructor frees it.  Then the capsule is renamed ``"used_hurray_tensor"`` and its list and
context belong to one owner object (:class:`_Handles`), which destroys both -- releasing each of
the producer's handles exactly once -- when the last view of the buffers goes away.  The buffers
are read-only ``memoryview`` s straight over the producer's memory (no copy), each over exactly
its table ``byte_size``.

A composite does not travel as one capsule (ADR-036 § 6: the protocol carries tensors):
:func:`composite_to_hurray` and :func:`composite_from_hurray` convert ``hs.Composite`` and
``hurray.Composite`` member by member, each member through the protocol.
"""

from __future__ import annotations

import ctypes
import weakref

import attrs

from ..codec import decode_descriptor, peek_descriptor_length
from ..errors import (
    AbiVersionMismatch, CapsuleBufferError, CapsuleConsumed, CapsuleError, HurraySchemaError, NativeProtocolError,
)
from ..model import CompositeMember, DeviceTag, MemberRole
from .native_abi import CAPSULE_NAME, USED_CAPSULE_NAME, USED_CAPSULE_NAME_BUFFER, check, native_abi, pythonapi
from .tensor import Composite, Tensor

__all__ = ["from_hurray", "consume_capsule", "composite_to_hurray", "composite_from_hurray"]


class _Handles:
    """The producer's buffer list and context, once consumed: destroyed together, once, when this
    object goes (every buffer view refers to it)."""

    __slots__ = ("__weakref__",)

    def __init__(self, abi, listing: int, context: int):
        weakref.finalize(self, _destroy, abi, listing, context)


def _destroy(abi, listing: int, context: int) -> None:
    handle = ctypes.c_void_p(listing)
    abi.buffer_list_destroy(ctypes.byref(handle))
    handle = ctypes.c_void_p(context)
    abi.tensor_context_destroy(ctypes.byref(handle))


def _buffer_view(address: int, size: int, owner: _Handles) -> memoryview:
    """A read-only byte view of ``size`` bytes at ``address`` that keeps ``owner`` alive."""
    if size == 0:
        return memoryview(b"")
    array = (ctypes.c_ubyte * size).from_address(address)
    array._owner = owner  # the view -> the ctypes array -> the handles
    return memoryview(array).cast("B").toreadonly()


def _capsule_of(obj):
    if not hasattr(obj, "__hurray__"):
        raise CapsuleError(f"{type(obj).__name__} has no __hurray__ method: it does not export the native protocol")
    return obj.__hurray__()


def from_hurray(obj, *, mode="strict") -> Tensor:
    """The tensor ``obj`` exports through the native protocol (``obj.__hurray__()``), its
    descriptor checked by our strict rules and its buffers viewed in place (no copy).

    ``obj`` is a ``hurray.Tensor`` (pyhurray), one of our :class:`~hurray_schema.Tensor` s, or any
    producer of a ``"hurray_tensor"`` capsule.  A ``hurray.Composite`` is taken member by member
    (:func:`composite_from_hurray`); a capsule whose descriptor is a composite head is refused.
    The module docstring lists the checks and the errors.  ``mode`` is the descriptor decoder's
    (``"permissive"`` keeps what the spec lets a permissive reader keep: a private layout, a
    newer minor version).  Needs the hurray-ffi C ABI (:mod:`hurray_schema.io.native_abi`)."""
    if _is_pyhurray_composite(obj):
        return composite_from_hurray(obj, mode=mode)
    capsule = _capsule_of(obj)
    return consume_capsule(capsule, mode=mode)


def consume_capsule(capsule, *, mode="strict") -> Tensor:
    """Consume one ``"hurray_tensor"`` capsule (the steps of the module docstring)."""
    if type(capsule).__name__ != "PyCapsule":
        raise CapsuleError(f"__hurray__() returned a {type(capsule).__name__}, not a PyCapsule")
    name = pythonapi.name_of(capsule)
    if name == USED_CAPSULE_NAME:
        raise CapsuleConsumed("the capsule was already consumed (named 'used_hurray_tensor'); "
                              "call __hurray__() again for a fresh one")
    if name != CAPSULE_NAME:
        raise CapsuleError(f"expected a 'hurray_tensor' capsule, got one named {name!r}")
    abi = native_abi()
    listing = pythonapi.get_pointer(capsule, pythonapi.get_name(capsule))
    context = pythonapi.get_context(capsule)
    if not listing or not context:
        pythonapi.err_clear()
        raise CapsuleError("the capsule has a null buffer list or a null context")
    version = ctypes.c_uint32()
    check(abi.tensor_context_abi_version(context, ctypes.byref(version)), "hurray_tensor_context_abi_version")
    if version.value != abi.abi_version:
        raise AbiVersionMismatch(version.value, abi.abi_version)
    descriptor = _descriptor(abi, context, mode)
    pointers = _buffers(abi, listing, descriptor)
    if pythonapi.set_name(capsule, ctypes.addressof(USED_CAPSULE_NAME_BUFFER)) != 0:
        pythonapi.err_clear()
        raise NativeProtocolError("could not mark the capsule consumed (PyCapsule_SetName failed)")
    owner = _Handles(abi, listing, context)
    views = tuple(_buffer_view(address, int(handle.byte_size), owner)
                  for (address, _size), handle in zip(pointers, descriptor.buffers))
    return Tensor.viewing(descriptor, views)


def _descriptor(abi, context: int, mode):
    at = ctypes.c_void_p()
    length = ctypes.c_uint64()
    check(abi.tensor_context_descriptor(context, ctypes.byref(at), ctypes.byref(length)),
          "hurray_tensor_context_descriptor")
    if not at.value or length.value == 0:
        raise CapsuleError("the capsule's context carries no descriptor")
    data = ctypes.string_at(at.value, length.value)
    descriptor = decode_descriptor(data, mode=mode)
    length = peek_descriptor_length(data)
    if length != len(data):
        raise CapsuleError(f"the capsule's context carries {len(data)} descriptor bytes and its descriptor_length "
                           f"is {length}")
    if descriptor.is_composite_head:
        raise CapsuleError("the capsule carries a composite head: the protocol carries tensors, a composite goes "
                           "member by member (ADR-036 § 6)")
    return descriptor


def _buffers(abi, listing: int, descriptor) -> list[tuple[int, int]]:
    """``(address, byte_size)`` of each buffer of the list, checked against the buffer table."""
    count = ctypes.c_uint64()
    check(abi.buffer_list_len(listing, ctypes.byref(count)), "hurray_buffer_list_len")
    if count.value != len(descriptor.buffers):
        raise CapsuleError(f"the capsule carries {count.value} buffers and its descriptor declares "
                           f"{len(descriptor.buffers)}")
    found = []
    for index, handle in enumerate(descriptor.buffers):
        borrowed = ctypes.c_void_p()
        check(abi.buffer_list_get(listing, index, ctypes.byref(borrowed)), "hurray_buffer_list_get")
        if not borrowed.value:
            raise CapsuleError(f"buffer {index} of the capsule is a null handle")
        address, size, device = ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_uint8()
        check(abi.buffer_data_ptr(borrowed, ctypes.byref(address)), "hurray_buffer_data_ptr")
        check(abi.buffer_byte_size(borrowed, ctypes.byref(size)), "hurray_buffer_byte_size")
        check(abi.buffer_device_tag(borrowed, ctypes.byref(device)), "hurray_buffer_device_tag")
        needed = int(handle.byte_size)
        if size.value < needed:
            raise CapsuleBufferError(f"buffer {index} holds {size.value} bytes and the buffer table declares {needed}")
        if needed and not address.value:
            raise CapsuleError(f"buffer {index} has a null data pointer and the buffer table declares {needed} bytes")
        if device.value != DeviceTag.CPU or int(handle.device_tag) != DeviceTag.CPU:
            raise CapsuleBufferError(f"buffer {index} is on device tag 0x{max(device.value, int(handle.device_tag)):02X}: "
                                     "only host (CPU) memory is read in place")
        found.append((address.value or 0, size.value))
    return found


# -- composites (ADR-036 § 6: member by member) ---------------------------------------------------

def _is_pyhurray_composite(obj) -> bool:
    return type(obj).__name__ == "Composite" and hasattr(obj, "members") and hasattr(obj, "member_count") and (
        not hasattr(obj, "__hurray__"))


_ROLES = {"base": MemberRole.BASE, "correction": MemberRole.CORRECTION}


def composite_from_hurray(composite, *, mode="strict") -> Composite:
    """Our :class:`~hurray_schema.Composite` of a ``hurray.Composite``: its head descriptor (encoded
    by pyhurray, decoded by our strict decoder) and each member through the protocol (no copy;
    a nested composite member by member in turn).  An overlay member's role, which pyhurray keeps
    on the composite (``member_roles``) and writes into the member's Composite Member section
    when it writes the composite out, is put in that section here too when the member lacks it,
    so the members' descriptors are those of pyhurray's own stream of the composite.  The result is judged by the composite binder
    like a composite read from a file (:meth:`Composite.validate`)."""
    head = decode_descriptor(bytes(composite.descriptor.encode()), mode=mode)
    roles = tuple(getattr(composite, "member_roles", None) or ())
    members = []
    for index, member in enumerate(composite.members):
        item = from_hurray(member, mode=mode)
        role = _ROLES.get(roles[index]) if index < len(roles) else None
        if role is not None and isinstance(item, Tensor) and item.descriptor.composite_member is None:
            # pyhurray keeps an overlay member's role on the composite and writes it into the member's
            # Composite Member section when it writes a file or a stream: the same descriptor here
            item = Tensor.viewing(attrs.evolve(item.descriptor, composite_member=CompositeMember(role)), item.buffers)
        members.append(item)
    result = Composite(head, members)
    result.validate()
    return result


def composite_to_hurray(composite: Composite):
    """The ``hurray.Composite`` of our :class:`~hurray_schema.Composite`: validated by our composite
    binder first, then each member handed to ``hurray.from_hurray`` (no copy) and the head's
    rule, shape, element type and combine op given to ``hurray.Composite`` (pyhurray builds the
    head itself).  Needs pyhurray."""
    composite.validate()
    try:
        import hurray
    except ImportError:
        raise NativeProtocolError("composite_to_hurray builds a hurray.Composite: install pyhurray") from None
    members = [composite_to_hurray(m) if isinstance(m, Composite) else hurray.from_hurray(m)
               for m in composite.members]
    layout = composite.descriptor.layout
    kwargs = {}
    if layout.combine_op:
        kwargs["combine_op"] = layout.combine_op.name.lower()
    try:
        return hurray.Composite(layout.composition_rule.name.lower(), shape=list(composite.shape),
                                dtype=_pyhurray_dtype(hurray, composite.descriptor.type_tag), members=members,
                                **kwargs)
    except Exception as exc:  # pyhurray's own errors: what it cannot build (a nested composite has no shard)
        raise NativeProtocolError(f"pyhurray refused the composite: {exc}") from exc


def _pyhurray_dtype(hurray, type_tag):
    name = type_tag.name.lower()
    dtype = getattr(hurray, name, None)
    if dtype is None:
        raise HurraySchemaError(f"pyhurray has no element type {name}")
    return dtype
