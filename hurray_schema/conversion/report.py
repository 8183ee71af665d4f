"""What a conversion reports: a :class:`TensorReport` per tensor (types and bytes in and out, how
far its values moved) and the :class:`ConvertReport` of the whole file, as a text table or as one
JSON object (schema :data:`CONVERT_JSON_SCHEMA`)."""

from __future__ import annotations

import json
from typing import Optional

import attrs

__all__ = ["TensorReport", "ConvertReport", "CONVERT_JSON_SCHEMA", "report_json"]

CONVERT_JSON_SCHEMA = "hurray-schema/convert/1"


@attrs.frozen(slots=True)
class TensorReport:
    """One tensor of a conversion: types and bytes in and out, and how far its values moved.

    ``max_abs_error`` and ``rel_frobenius_error`` (``||out - in|| / ||in||``, 0 when both are
    zero) compare the output's decoded values with the input's as its own library decodes them;
    they are measured for every tensor whose values may change (quantize, spqr, requantize) and,
    with ``verify``, for the exact ones too; otherwise an exact conversion reports 0.0 and
    ``measured`` is false.  ``max_ulp``: for a quantized checkpoint's linear, the largest distance
    of its output from the library's dequantization, in units in the last place of the library's
    dtype (None where not measured)."""

    name: str
    type_in: str
    type_out: str
    bytes_in: int
    bytes_out: int
    max_abs_error: float
    rel_frobenius_error: float
    exact: bool
    measured: bool
    note: str = ""
    max_ulp: Optional[int] = None

    def to_json(self) -> dict:
        return attrs.asdict(self)


@attrs.frozen(slots=True)
class ConvertReport:
    """What :func:`~hurray_schema.conversion.convert` did: the formats and a :class:`TensorReport`
    per tensor, in output order."""

    source: str
    destination: str
    source_format: str
    destination_format: str
    tensors: tuple

    @property
    def bytes_in(self) -> int:
        return sum(t.bytes_in for t in self.tensors)

    @property
    def bytes_out(self) -> int:
        return sum(t.bytes_out for t in self.tensors)

    def to_json(self) -> dict:
        return {"schema": CONVERT_JSON_SCHEMA, "source": self.source, "destination": self.destination,
                "source_format": self.source_format, "destination_format": self.destination_format,
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
                "tensors": [t.to_json() for t in self.tensors]}

    def text(self) -> str:
        """A table: name, type in -> out, bytes in -> out, max abs error, relative Frobenius error."""
        with_ulp = any(t.max_ulp is not None for t in self.tensors)
        rows = [("tensor", "type in", "type out", "bytes in", "bytes out", "max abs err", "rel frob err")
                + (("max ulp",) if with_ulp else ())]
        for t in self.tensors:
            errors = (f"{t.max_abs_error:.3g}", f"{t.rel_frobenius_error:.3g}") if t.measured or not t.exact \
                else ("0 (exact)", "0 (exact)")
            ulp = (("-" if t.max_ulp is None else str(t.max_ulp)),) if with_ulp else ()
            rows.append((t.name, t.type_in, t.type_out, str(t.bytes_in), str(t.bytes_out)) + errors + ulp)
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) if i < 3 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
                 for row in rows]
        notes = [t.note if t.note.startswith(t.name) else f"{t.name}: {t.note}" for t in self.tensors if t.note]
        total = (f"{len(self.tensors)} tensors, {self.bytes_in} bytes in, {self.bytes_out} bytes out: "
                 f"{self.source} ({self.source_format}) -> {self.destination} ({self.destination_format})")
        return "\n".join(lines + notes + [total])


def report_json(report: ConvertReport) -> str:
    return json.dumps(report.to_json(), indent=2)
