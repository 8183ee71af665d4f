"""A lone descriptor, and the one step every container walk delegates: ``describe``.

A descriptor (``metadata.md § Overall Descriptor Structure``) is located as one part; field by
field it is the codec's and the annotated view's business.  How it is taken is the caller's
``describe`` (:data:`~.common.Describe`), one of:

* :func:`strict_describer` -- the readers' (``RAISE``): the structural decode, then the first
  untolerated semantic rule raises; a descriptor seen before takes the compiled path
  (:mod:`hurray_schema.signature`), which records nothing;
* :func:`collect_descriptor` -- ``audit``'s (``COLLECT``): every finding of the decode and of
  every semantic rule, a structural fault becoming the part's ``fault``.

:func:`walk_descriptor` is the walk of a lone descriptor under either.
"""

from __future__ import annotations

from typing import Iterator, Optional

from ...codec import checked_by, checked_descriptor, parse_descriptor, peek_descriptor_length
from ...errors import SpecViolation
from ...limits import DEFAULT_LIMITS, Limits
from ...model import SyncMode, TensorDescriptor
from ...rules import container as container_rules
from ...rules.descriptor import check_descriptor, first_error
from ...rules.engine import Mode
from ...signature import accepted
from ...structs.descriptor import FIXED_HEADER
from .common import DESCRIPTOR, Describe, Part, as_view, new_part, violation_finding

__all__ = ["strict_descriptor", "strict_describer", "collect_descriptor", "walk_descriptor"]


def walk_descriptor(view, describe: Describe) -> Iterator[Part]:
    """The one part of a lone descriptor (``metadata.md § Overall Descriptor Structure``):
    ``describe`` of the whole input."""
    yield describe(as_view(view), 0, 0)


def strict_descriptor(buf, base: int, depth: int, *, mode: Mode, limits: Limits = DEFAULT_LIMITS,
                      cross_machine: bool = False, findings: Optional[list] = None) -> Part:
    """The descriptor that is ``buf`` (exactly its ``descriptor_length`` bytes) as a reader
    takes it (``RAISE``): the structural decode, then the first untolerated semantic rule raises.  What the mode
    tolerated and the SHOULD-level findings go to ``findings`` (before anything raises) when given, else to the
    part; a descriptor with none of them takes the compiled path, which records nothing."""
    describe = strict_describer(mode=mode, limits=limits, cross_machine=cross_machine, findings=findings)
    return describe(buf, base, depth)


def strict_describer(*, mode: Mode, limits: Limits = DEFAULT_LIMITS, cross_machine: bool = False,
                     findings: Optional[list] = None) -> Describe:
    """The readers' ``describe``: :func:`strict_descriptor` with its options bound once, as
    one plain function (a reader calls it for every tensor).  Its attributes ``known`` and
    ``value`` take a descriptor whose header a walk already looked up in the compiled decoders
    (``known(buf, compiled, base)``: the part; ``value``: the descriptor alone)."""

    def describe(buf, base: int, depth: int) -> Part:
        if buf.__class__ is bytes:  # under a header compiled before: decoded and checked by its generated code
            desc = checked_descriptor(buf, limits)
            if desc is not None:
                if cross_machine:
                    _check_producer_synced(desc, base)
                return new_part(Part, (DESCRIPTOR, base, base + len(buf), FIXED_HEADER, desc, None, "", (), 0, depth))
        return general(buf, base, depth)

    default_limits = limits is DEFAULT_LIMITS

    def checked(buf: bytes, compiled, base: int) -> Optional[TensorDescriptor]:
        """The descriptor of ``buf`` (exactly one) where the walk found ``compiled`` for its header
        already, when every rule passes on it: what :func:`checked_descriptor` would look up, taken
        first from the descriptors every rule passed on before; None: the general path decides."""
        desc = accepted(buf) if default_limits else None
        if desc is None:
            desc = checked_by(compiled, buf, buf, limits)
        if desc is not None and cross_machine:
            _check_producer_synced(desc, base)
        return desc

    def known(buf: bytes, compiled, base: int) -> Part:
        """``describe(buf, base, 0)`` where the walk found ``compiled`` for the header of ``buf``."""
        desc = checked(buf, compiled, base)
        if desc is None:
            return general(buf, base, 0)
        return new_part(Part, (DESCRIPTOR, base, base + len(buf), FIXED_HEADER, desc, None, "", (), 0, 0))

    def value(buf: bytes, compiled, base: int) -> TensorDescriptor:
        """What :func:`known` gives, the descriptor alone (a stream read's per-tensor path)."""
        desc = checked(buf, compiled, base)
        return desc if desc is not None else general(buf, base, 0).value

    def general(buf, base: int, depth: int) -> Part:
        """The descriptor decoded the general way, every rule run (it reports what fails):
        what the decode tolerated, then the semantic rules' SHOULD-level and tolerated
        findings, in audit's order (:func:`collect_descriptor`), before the first error."""
        desc, tolerated = parse_descriptor(buf, mode=mode, base=base, limits=limits)
        if findings is not None:
            if tolerated:
                findings.extend(tolerated)
            tolerated = ()
            error = first_error(desc, mode, base=base, notes=findings)
        else:
            tolerated = list(tolerated)
            error = first_error(desc, mode, base=base, notes=tolerated)
        if error is not None:
            raise error.to_violation()
        if cross_machine:
            _check_producer_synced(desc, base)
        return new_part(Part, (DESCRIPTOR, base, base + len(buf), FIXED_HEADER, desc, None, "",
                               tuple(tolerated) if tolerated else (), 0, depth))

    describe.known = known  # for the bare walk, which looks the header up to frame the descriptor
    describe.value = value  # the same, the descriptor alone (a stream read's per-tensor path)
    return describe


def _check_producer_synced(desc: TensorDescriptor, base: int) -> None:
    """A cross-machine stream carries producer-synced buffers only
    (``interchange.md § Completion``)."""
    for i, h in enumerate(desc.buffers):
        if h.sync_mode != SyncMode.PRODUCER_SYNCED:
            raise container_rules.CROSS_MACHINE_SYNC.violation(
                f"buffer {i} declares sync_mode 0x{int(h.sync_mode):02X} on a cross-machine stream", base)


def collect_descriptor(buf, base: int, depth: int, mode: Mode) -> Part:
    """The descriptor at the start of ``buf`` as ``audit`` takes it (``COLLECT``): every
    finding of the structural decode and of every semantic rule.  A structural fault is
    the part's ``fault`` (its value is then ``None``: nothing after it can be located)."""
    try:
        desc, findings = parse_descriptor(buf, mode=mode, base=base)
    except SpecViolation as exc:
        fault = violation_finding(exc)
        return Part(DESCRIPTOR, base, base, FIXED_HEADER, None, fault=fault, findings=(fault,), depth=depth)
    findings = list(findings) + check_descriptor(desc, mode, base=base)
    # the decode took descriptor_length bytes (what a decoded descriptor re-encodes to, without encoding it again)
    return Part(DESCRIPTOR, base, base + peek_descriptor_length(buf, base), FIXED_HEADER, desc, findings=tuple(findings),
                depth=depth)
