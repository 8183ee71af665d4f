"""Converted buffers waiting for the writer: :class:`Spill` keeps them in memory up to a budget,
the rest in an unnamed temporary file beside the output."""

from __future__ import annotations

import mmap
import os
import tempfile

__all__ = ["Spill"]


class Spill:
    """Converted tensors kept for the writer: in memory up to ``budget`` bytes, then in a temporary
    file beside the output, memory-mapped (the writer reads them back once).

    The file has no name, so a killed conversion leaves nothing behind: ``tempfile.TemporaryFile``
    opens it with ``O_TMPFILE`` on Linux, elsewhere unlinks it as soon as it is created."""

    def __init__(self, folder: str, budget: int):
        self.folder, self.budget, self.used = folder, budget, 0
        self.file = None
        self.maps: list = []

    def keep(self, item):
        from ..io import Tensor

        if not isinstance(item, Tensor):
            return item
        size = item.stored_nbytes
        if self.used + size <= self.budget:
            self.used += size
            return item
        if self.file is None:
            self.file = tempfile.TemporaryFile(dir=self.folder, prefix=".hurray-convert-")
        views = []
        for buffer in item.buffers:
            start = self.file.seek(0, os.SEEK_END)
            start += -start % mmap.ALLOCATIONGRANULARITY
            self.file.seek(start)
            self.file.write(buffer)
            self.file.flush()
            if len(buffer) == 0:
                views.append(b"")
                continue
            mapped = mmap.mmap(self.file.fileno(), len(buffer), offset=start, access=mmap.ACCESS_READ)
            self.maps.append(mapped)
            views.append(memoryview(mapped))
        return Tensor(item.descriptor, views, name=item.name)

    def close(self) -> None:
        for mapped in self.maps:
            try:
                mapped.close()
            except BufferError:  # a view still alive; the map goes with it
                pass
        if self.file is not None:
            self.file.close()
