"""The reference implementation's verdict on each vector (``pyhurray``, ``import hurray``).

pyhurray is a native extension that aborts its process on some hostile inputs
(``spec-map.md § Divergences``, DIV-STREAM-ABORT, DIV-FILE-ABORT), so it never runs in
this process: one worker interpreter judges every vector, each in a forked child, and a
child that dies without answering is an ``abort``.  A vector is accepted when pyhurray
decodes it (a descriptor), iterates it (a bare stream) or loads it and its KV section
(a file); pyhurray has no reader for the message framing (``interchange.md § Scope``
divergence row), so message streams get no reference verdict.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from typing import Optional

__all__ = ["available", "reference_verdicts", "DIVERGENCES", "divergence_of", "ACCEPT", "REJECT", "ABORT"]

ACCEPT, REJECT, ABORT = "accept", "reject", "abort"

DIVERGENCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("DIV-BUFSIZE", ("adr007.empty.data_buffer_size", "layout.dense.buffer_size", "layout.hilbert.buffer_size",
                     "layout.morton.buffer_size", "layout.sparse.buffer_size", "layout.strided.buffer_bounds",
                     "metadata.byte_offset.bounds", "quantization.buffer.size")),
    ("DIV-LAYOUT", ("data_model.scalar.layout", "data_model.shard.dynamic", "layout.block_paged.buffer_count",
                    "layout.block_paged.byte_offset", "layout.block_paged.page_size", "layout.block_paged.paged_axis",
                    "layout.block_paged.rank", "layout.coo.buffer_count", "layout.coo.byte_offset",
                    "layout.csc.buffer_count", "layout.csc.byte_offset", "layout.csc.rank",
                    "layout.csf.buffer_count", "layout.csf.byte_offset", "layout.csf.rank",
                    "layout.csr.buffer_count", "layout.csr.byte_offset", "layout.csr.rank",
                    "layout.hilbert.rank", "layout.hilbert.shape", "layout.morton.shape",
                    "metadata.buffer_count.dense")),
    ("DIV-QUANT", ("quantization.axis", "quantization.block_padding", "quantization.block_size.upper",
                   "quantization.buffer_index.data", "quantization.buffer_index.range",
                   "quantization.mxfp.storage_type", "quantization.nf4.storage_type",
                   "quantization.per_block.storage_type", "quantization.per_channel.storage_type",
                   "quantization.per_tensor.storage_type", "quantization.per_tensor.zero_point",
                   "quantization.scheme_version.value")),
    ("DIV-AXIS-DYNAMIC", ("quantization.axis.dynamic",)),
    ("DIV-MXFP-MULTIPLE", ("quantization.mxfp.multiple",)),
    ("DIV-QUANT-VALUES", ("quantization.mxfp.scale_reserved", "quantization.nf4.absmax_values",
                          "quantization.per_block.scale_values", "quantization.per_channel.scale_values")),
    ("DIV-BUFFER", ("buffer.colocation", "buffer.memory_class.device", "buffer.memory_class.private")),
    ("DIV-EXTTYPE", ("metadata.extension_type.float_fields",)),
    ("DIV-EXTLAYOUT", ("descriptor.layout.extension_unknown",)),
    ("DIV-STATS", ("layout.sparse.statistics_nnz", "metadata.statistics.nm", "metadata.statistics.stddev")),
    ("DIV-MINOR", ("descriptor.version_minor",)),
    ("DIV-MINOR-TRUNC", ("descriptor.truncated",)),
    ("DIV-TRUNC", ("descriptor.truncated",)),
    ("DIV-SYMIDX", ("quantization.per_block.symmetric_index",)),
    ("DIV-NEWFLAGS", ("descriptor.flags.reserved", "descriptor.version_minor")),
    ("DIV-STREAM-ABORT", ("limit.max_composite_members", "stream.truncated")),
    ("DIV-NESTING", ("composite.nesting.depth",)),
    ("DIV-FILE-ABORT", ("adr007.empty.data_buffer_size", "file.data.length", "file.header.alignment",
                        "file.header.first_descriptor_offset", "file.header.reserved", "file.index.bounds",
                        "file.index.truncated", "limit.max_composite_members", "metadata.byte_offset.bounds")),
    ("DIV-FILE-HEADER", ("file.header.alignment", "file.header.first_descriptor_offset", "file.header.reserved")),
    ("DIV-FILE-TRAILER", ("file.index.alignment", "file.index.bounds", "file.index.crc_unset",
                          "file.trailer.reserved")),
    ("DIV-FILE-INDEX", ("file.index.descriptor_length", "file.index.flags", "file.index.sorted",
                        "file.index.truncated")),
    ("DIV-FILE-PLACEMENT", ("file.data.alignment", "file.data.bounds", "file.data.length",
                            "file.index.descriptor_bounds", "file.index.overlap")),
    ("DIV-FILE-KV", ("file.kv.bounds", "file.kv.truncated")),
)
"""The ids of ``spec-map.md § Divergences › Differential run`` and the rule ids each row
names (``tests/test_vectors.py`` checks this table against spec-map.md)."""


def divergence_of(rule_id: str) -> Optional[str]:
    """The first Divergences row that names ``rule_id``, or None."""
    return next((row for row, rules in DIVERGENCES if rule_id in rules), None)


def available() -> bool:
    """True when pyhurray is installed."""
    return importlib.util.find_spec("hurray") is not None


_WORKER = r'''
import json, os, sys
import hurray

PROPS = ("buffer_count", "buffer_handles", "byte_offset", "device", "dtype", "extension_type", "layout",
         "ndim", "quantization", "shape", "shard", "size", "statistics", "version")

def touch(value, depth=0):
    # pyhurray decodes some sections on first access: read every public attribute, deeply
    if depth > 8 or value is None or isinstance(value, (bool, int, float, str, bytes)):
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            touch(v, depth + 1)
        return
    for name in dir(value):
        if not name.startswith("_"):
            attr = getattr(value, name)
            if not callable(attr):
                touch(attr, depth + 1)

def touch_descriptor(desc):
    for name in PROPS:
        touch(getattr(desc, name))

def touch_item(item):
    touch_descriptor(item.descriptor)
    if isinstance(item, hurray.Composite):
        item.member_roles
        for member in item.members:
            touch_item(member)

def descriptor(path):
    with open(path, "rb") as f:
        touch_descriptor(hurray.Descriptor.decode(f.read()))

def stream(path):
    with open(path, "rb") as f:
        data = f.read()
    for item in hurray.StreamReader(data, max_buffer_bytes=len(data)):
        touch_item(item)

def file(path):
    for item in hurray.load(path).values():
        touch_item(item)
    hurray.load_kv(path)

JUDGES = {"descriptor": descriptor, "stream": stream, "file": file}
answers = []
for kind, path in json.load(open(sys.argv[1])):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            JUDGES[kind](path)
            verdict = "accept"
        except Exception:
            verdict = "reject"
        os.write(w, verdict.encode())
        os._exit(0)
    os.close(w)
    answer = b""
    while True:
        chunk = os.read(r, 64)
        if not chunk:
            break
        answer += chunk
    os.close(r)
    os.waitpid(pid, 0)
    answers.append(answer.decode() or "abort")
print(json.dumps(answers))
'''


def reference_verdicts(vectors) -> dict[str, str]:
    """File name → pyhurray's verdict (``accept``, ``reject``, ``abort``) for every vector
    of a kind pyhurray reads; empty when pyhurray is not installed."""
    judged = [v for v in vectors if v.kind in ("descriptor", "stream", "file")]
    if not available() or not judged:
        return {}
    with tempfile.TemporaryDirectory(prefix="hurray-vectors-reference-") as scratch:
        todo = []
        for vector in judged:
            path = os.path.join(scratch, vector.file)
            with open(path, "wb") as out:
                out.write(vector.data)
            todo.append((vector.kind, path))
        listing = os.path.join(scratch, "todo.json")
        with open(listing, "w", encoding="utf-8") as out:
            json.dump(todo, out)
        env = dict(os.environ, RUST_BACKTRACE="0")
        done = subprocess.run([sys.executable, "-c", _WORKER, listing], capture_output=True, text=True, env=env,
                              check=True)
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    return {vector.file: answer for vector, answer in zip(judged, answers)}
