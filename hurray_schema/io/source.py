"""Where a file's bytes come from: a path, or any fsspec URL read by byte range.

A ``.hrry`` file is laid out for reading by range (``file-format.md § Reader Protocol``): the
trailer points at the index, the index at each descriptor, each descriptor at its buffers.  A
URL (``https://``, ``s3://``, any fsspec protocol; the ``[remote]`` extra) is read that way:

* a :class:`ByteSource` answers byte ranges exactly or raises a :class:`~hurray_schema.errors.SourceError`:
  a range answered short or long is :class:`~hurray_schema.errors.ShortRead`, a server that
  ignores ``Range`` :class:`~hurray_schema.errors.RangeNotSupported` (found from the status and
  headers, before the body is read), a file whose size or ETag changed since it was opened
  :class:`~hurray_schema.errors.SourceChanged` (HTTP and S3 ask with ``If-Match``), a server
  error, a refused connection or a timeout :class:`~hurray_schema.errors.SourceUnavailable`.
  Every request has bounded timeouts (:data:`DEFAULT_TIMEOUT`);
* a :class:`LocalFileSource` is a local path read the same way, by ``os.pread`` on one descriptor
  and never mapped (``read_file(path, mmap=False)``): a file that shrinks or changes under the
  reader raises :class:`~hurray_schema.errors.ShortRead` or
  :class:`~hurray_schema.errors.SourceChanged` where a mapped file's pages raise ``SIGBUS``;
* a :class:`RangeReader` puts the ranges the reader asks for into requests, the requests of a
  batch sent concurrently: small reads rounded out to blocks of ``block_size``, blocks near each
  other fetched by one request and kept in a least-recently-used block cache bounded by
  ``cache_bytes``; the sections and descriptors read at open, and the data a read decodes (a box,
  a member), fetched exactly, ranges closer than asking for them apart would cost joined
  (:attr:`ByteSource.range_cost`);
* :class:`SourceView` is the file as the one walk of the file (:func:`hurray_schema.io.file.walk.walk_file`) reads
  it: its length and its slices, each slice fetched through the reader;
* :class:`SourcedBuffers` are one tensor's buffers: an anonymous mapping per buffer, made on
  first use (pages cost nothing until written) into which the byte ranges a read decodes are
  fetched before the evaluator runs (:func:`hurray_schema.evaluate.region.needed_spans`); whoever takes
  ``tensor.buffers`` directly gets the whole buffers fetched first.

A :class:`SourceRef` names a file as a process that shares nothing with the reader finds it
again: the path or URL, the storage options, the size and ETag when opened.  Items read from a
file pickle as their :class:`SourceRef`, byte ranges and descriptor, and dask tasks fetch their
own byte ranges through it (a local file's ref is its absolute path: a :class:`LocalFileSource`
again).  fsspec, aiohttp and s3fs are imported when a URL is opened, never for a local path.
"""

from __future__ import annotations

import bisect
import errno
import mmap
import os
import stat
import threading
from collections import OrderedDict
from typing import Any, Optional, Sequence

import attrs

from ..errors import HurraySchemaError, RangeNotSupported, ShortRead, SourceChanged, SourceUnavailable
from .walk.common import is_url

__all__ = ["SourceRef", "ByteSource", "HttpSource", "FsspecSource", "MemorySource", "LocalFileSource", "RangeReader",
           "SourceView", "SourcedBuffers", "RemoteBuffers", "is_url", "open_source", "reader_for", "register",
           "unregister", "fill_all", "DEFAULT_BLOCK_SIZE", "DEFAULT_CACHE_BYTES", "MAX_TAIL_BYTES", "DEFAULT_TIMEOUT",
           "tail_bytes"]

DEFAULT_BLOCK_SIZE = 64 * 1024
"""Ranges are fetched in whole blocks of this many bytes (aligned to the file's start)."""

DEFAULT_CACHE_BYTES = 32 * 1024 * 1024
"""The block cache of a :class:`RangeReader` holds at most this many bytes."""

MAX_TAIL_BYTES = 1024 * 1024
"""Opening a URL reads the end of the file at once -- the trailer, and the index and KV section
before it when they fit (``file-format.md § Reader Protocol``): a thousandth of the file, at least
one block, at most this many bytes (:func:`tail_bytes`)."""


def tail_bytes(size: int, block_size: int) -> int:
    """How many bytes at the end of a ``size``-byte file opening reads first."""
    return min(size, max(block_size, min(MAX_TAIL_BYTES, size // 1000)))

DEFAULT_TIMEOUT = 30.0
"""Seconds a connection may take to open, and a read to deliver its next bytes."""

RANGE_COST = 4096
"""What asking a source for one more range costs, counted in bytes one could fetch for nothing
instead: a request of its own (an object store, a server answering one range per ``GET``).  A
range reader fetches the gap between two ranges along with them rather than ask for them apart
while that costs less (:meth:`RangeReader._bounded_runs`)."""

PART_COST = 128
""":data:`RANGE_COST` where one more range is cheap: a part of a ``multipart/byteranges`` answer
(nginx's part headers are about 100 bytes), or one more ``os.pread``."""

RUN_SLACK = 32
"""A run of ranges fetched as one carries at most ``1 / RUN_SLACK`` more bytes than it asks for, plus
one range's cost: a box read fetches at most about 3 % more than it decodes, and more only where
its ranges lie closer together than a range costs (a box a few hundred bytes wide per row)."""

MAX_CONCURRENT_REQUESTS = 16
"""Requests of one batch in flight at once."""


def _options_key(options) -> str:
    return repr(sorted((str(key), repr(value)) for key, value in dict(options).items()))


@attrs.frozen(slots=True)
class SourceRef:
    """A file as another process finds it again: ``url`` (an absolute path or a URL),
    ``storage_options`` (fsspec's; pickled with the ref, credentials included), and the
    ``size`` and ``etag`` it had when opened (a source of another size or ETag is refused)."""

    url: str
    size: int
    etag: Optional[str] = None
    storage_options: tuple = ()

    @property
    def options(self) -> dict:
        return dict(self.storage_options)

    @property
    def key(self) -> tuple:
        return (self.url, self.size, self.etag, _options_key(self.storage_options))


# --------------------------------------------------------------------------------------
# Byte sources
# --------------------------------------------------------------------------------------


class ByteSource:
    """The bytes of one file by range.  :meth:`fetch` answers each ``(start, stop)`` with
    exactly ``stop - start`` bytes or raises a :class:`~hurray_schema.errors.SourceError`."""

    ref: SourceRef
    requests = 0
    """Requests made for ranges so far (one per range, or fewer where one request asks several)."""
    range_cost = RANGE_COST
    """What one more range costs, in bytes (:data:`RANGE_COST`, :data:`PART_COST`)."""

    @property
    def size(self) -> int:
        return self.ref.size

    def fetch(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        raise NotImplementedError


def _check_range(url: str, start: int, stop: int, data: bytes) -> bytes:
    if len(data) != stop - start:
        raise ShortRead(f"{url}: bytes [{start}, {stop}) answered with {len(data)} bytes, not {stop - start}")
    return data


def _timeout(seconds: float):
    import aiohttp

    return aiohttp.ClientTimeout(total=None, connect=seconds, sock_connect=seconds, sock_read=seconds)


def _run(loop, coroutine, seconds: float):
    """``coroutine`` run on fsspec's loop thread; every failure a typed error."""
    import asyncio

    from fsspec.asyn import FSTimeoutError, sync

    try:
        return sync(loop, lambda: coroutine)
    except (HurraySchemaError, FileNotFoundError, PermissionError, _NoMultiRange):
        raise
    except (FSTimeoutError, asyncio.TimeoutError, TimeoutError) as exc:
        raise SourceUnavailable(f"no answer within {seconds} s ({type(exc).__name__})") from exc
    except Exception as exc:  # aiohttp's and botocore's many connection errors
        raise SourceUnavailable(f"{type(exc).__name__}: {exc}") from exc


async def _bounded(coroutines):
    import asyncio

    gate = asyncio.Semaphore(MAX_CONCURRENT_REQUESTS)

    async def one(coroutine):
        async with gate:
            return await coroutine

    return await asyncio.gather(*(one(c) for c in coroutines))


MAX_RANGES_PER_REQUEST = 200
"""Ranges one multi-range ``GET`` asks for at most (its ``Range`` header stays short)."""


class _NoMultiRange(Exception):
    """The server answered a multi-range request otherwise than with ``multipart/byteranges``."""


def _boundary(parameters: str) -> Optional[bytes]:
    for parameter in parameters.split(";"):
        name, _, value = parameter.strip().partition("=")
        if name.lower() == "boundary" and value:
            return value.strip('"').encode("latin-1")
    return None


def _content_range(answered: str):
    """``(first, last, total)`` of a ``Content-Range`` value (total None for ``*``), all None if malformed."""
    unit, _, rest = answered.partition(" ")
    span, _, total = rest.partition("/")
    first, _, last = span.partition("-")
    try:
        return int(first), int(last), (int(total) if total != "*" else None)
    except ValueError:
        return None, None, None


class HttpSource(ByteSource):
    """An ``http://`` or ``https://`` URL through fsspec's HTTP filesystem session: a ``HEAD``
    for the size and ETag, then one ``GET`` with ``Range`` (and ``If-Match`` when the server
    gave an ETag) per merged range; a ``206`` whose ``Content-Range`` says the range asked and
    the size opened is read, anything else is refused before its body is read."""

    def __init__(self, url: str, storage_options: Optional[dict] = None, *, size: Optional[int] = None,
                 etag: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT):
        import fsspec

        self.url = url
        options = dict(storage_options or {})
        self.fs = fsspec.filesystem(url.split("://", 1)[0], **options)
        self.timeout = float(timeout)
        self.multirange = True
        self.requests = 0
        if size is None:
            size, etag = _run(self.fs.loop, self._head(), self.timeout)
        self.ref = SourceRef(url, int(size), etag, tuple(sorted(options.items())))

    @property
    def range_cost(self) -> int:
        """A part of a multi-range answer while the server gives those, else a request of its own."""
        return PART_COST if self.multirange else RANGE_COST

    async def _session(self):
        return await self.fs.set_session()

    async def _head(self) -> tuple[int, Optional[str]]:
        """The size and ETag: from a ``HEAD``, else (a server that refuses ``HEAD``, as presigned
        URLs do) from the ``Content-Range`` of a one-byte ``GET``."""
        session = await self._session()
        async with session.head(self.url, allow_redirects=True, timeout=_timeout(self.timeout),
                                headers={"Accept-Encoding": "identity"}) as response:
            length = response.headers.get("Content-Length")
            if response.status < 400 and length is not None:
                return int(length), response.headers.get("ETag")
            if response.status not in (403, 405, 501) and response.status < 500:
                self._raise_for_status(response, "HEAD")
        async with session.get(self.url, allow_redirects=True, timeout=_timeout(self.timeout),
                               headers={"Range": "bytes=0-0", "Accept-Encoding": "identity"}) as response:
            self._raise_for_status(response, "GET bytes 0-0")
            total = response.headers.get("Content-Range", "").rpartition("/")[2]
            if response.status != 206 or not total.isdigit():
                raise SourceUnavailable(f"{self.url}: neither HEAD nor a one-byte GET gives the file's size")
            return int(total), response.headers.get("ETag")

    def _raise_for_status(self, response, what: str) -> None:
        status = response.status
        if status == 404:
            raise FileNotFoundError(self.url)
        if status in (401, 403):
            raise PermissionError(f"{self.url}: HTTP {status}")
        if status == 412:
            raise SourceChanged(f"{self.url}: its ETag is not the one it had when opened (HTTP 412 to If-Match)")
        if status >= 400:
            raise SourceUnavailable(f"{self.url}: HTTP {status} to {what}")

    async def _get(self, session, start: int, stop: int) -> bytes:
        import asyncio

        headers = {"Range": f"bytes={start}-{stop - 1}", "Accept-Encoding": "identity"}
        if self.ref.etag:
            headers["If-Match"] = self.ref.etag
        self.requests += 1
        async with session.get(self.url, headers=headers, timeout=_timeout(self.timeout)) as response:
            self._raise_for_status(response, f"GET bytes {start}-{stop - 1}")
            if response.status != 206:
                raise RangeNotSupported(f"{self.url}: HTTP {response.status} to a Range request: the server "
                                        "sends the whole file, not the bytes asked")
            self._check_answer(response.headers, start, stop)
            try:
                data = await response.content.readexactly(stop - start)
            except asyncio.IncompleteReadError as exc:
                raise ShortRead(f"{self.url}: bytes [{start}, {stop}) cut off after {len(exc.partial)} bytes") from None
            except Exception as exc:  # aiohttp.ClientPayloadError: the connection closed early
                raise ShortRead(f"{self.url}: bytes [{start}, {stop}) cut off ({type(exc).__name__})") from None
            return data

    def _check_answer(self, headers, start: int, stop: int) -> None:
        etag = headers.get("ETag")
        if self.ref.etag and etag and etag != self.ref.etag:
            raise SourceChanged(f"{self.url}: ETag {etag}, {self.ref.etag} when opened")
        answered = headers.get("Content-Range", "")
        first, last, total = _content_range(answered)
        if first is None:
            raise RangeNotSupported(f"{self.url}: Content-Range {answered!r} to bytes {start}-{stop - 1}")
        if total is not None and total != self.ref.size:
            raise SourceChanged(f"{self.url}: {total} bytes, {self.ref.size} when opened")
        if (first, last + 1) != (start, stop):
            raise ShortRead(f"{self.url}: Content-Range {answered!r} answers bytes {start}-{stop - 1}")

    def fetch(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Each range by its own ``GET``, or, for several, ``GET`` s of up to :data:`MAX_RANGES_PER_REQUEST`
        ranges each answered as ``multipart/byteranges`` (RFC 9110 § 14.6) while the server does
        so; a server that answers such a request otherwise is asked one range at a time from then on."""
        ranges = list(ranges)
        if len(ranges) > 1 and self.multirange:
            try:
                return _run(self.fs.loop, self._all_multi(ranges), self.timeout)
            except _NoMultiRange:
                self.multirange = False

        async def all_ranges():
            session = await self._session()
            return await _bounded([self._get(session, start, stop) for start, stop in ranges])

        return _run(self.fs.loop, all_ranges(), self.timeout)

    async def _all_multi(self, ranges):
        session = await self._session()
        groups = [ranges[at: at + MAX_RANGES_PER_REQUEST] for at in range(0, len(ranges), MAX_RANGES_PER_REQUEST)]
        answers = await _bounded([self._get_multi(session, group) for group in groups])
        return [data for answer in answers for data in answer]

    async def _get_multi(self, session, ranges) -> list[bytes]:
        headers = {"Range": "bytes=" + ",".join(f"{start}-{stop - 1}" for start, stop in ranges),
                   "Accept-Encoding": "identity"}
        if self.ref.etag:
            headers["If-Match"] = self.ref.etag
        self.requests += 1
        async with session.get(self.url, headers=headers, timeout=_timeout(self.timeout)) as response:
            self._raise_for_status(response, "GET of several ranges")
            kind, _, parameters = response.headers.get("Content-Type", "").partition(";")
            if response.status != 206 or kind.strip().lower() != "multipart/byteranges":
                raise _NoMultiRange  # the body is not read
            etag = response.headers.get("ETag")
            if self.ref.etag and etag and etag != self.ref.etag:
                raise SourceChanged(f"{self.url}: ETag {etag}, {self.ref.etag} when opened")
            boundary = _boundary(parameters)
            length = response.headers.get("Content-Length")
            bound = sum(stop - start for start, stop in ranges) + 512 * len(ranges) + 4096
            if boundary is None or length is None or int(length) > bound:
                raise RangeNotSupported(f"{self.url}: a multipart answer of {length} bytes to {len(ranges)} ranges")
            try:
                body = await response.content.readexactly(int(length))
            except Exception as exc:
                raise ShortRead(f"{self.url}: a multipart answer cut off ({type(exc).__name__})") from None
        parts = self._parts(body, boundary)
        return [self._covered(parts, start, stop) for start, stop in ranges]

    def _parts(self, body: bytes, boundary: bytes) -> list[tuple[int, bytes]]:
        """``(first byte, data)`` of each part of a ``multipart/byteranges`` body, its
        ``Content-Range`` checked against the size opened."""
        parts = []
        for chunk in body.split(b"--" + boundary)[1:]:
            if chunk.startswith(b"--"):
                break
            head, separator, data = chunk.partition(b"\r\n\r\n")
            if not separator:
                raise ShortRead(f"{self.url}: a multipart part without its headers")
            answered = next((line.split(b":", 1)[1].strip().decode("latin-1") for line in head.split(b"\r\n")
                             if line.lower().startswith(b"content-range:")), "")
            first, last, total = _content_range(answered)
            if first is None:
                raise ShortRead(f"{self.url}: a multipart part with Content-Range {answered!r}")
            if total is not None and total != self.ref.size:
                raise SourceChanged(f"{self.url}: {total} bytes, {self.ref.size} when opened")
            if len(data) < last + 1 - first:
                raise ShortRead(f"{self.url}: bytes {first}-{last} cut off in a multipart answer")
            parts.append((first, data[: last + 1 - first]))
        return parts

    def _covered(self, parts, start: int, stop: int) -> bytes:
        for first, data in parts:
            if first <= start and stop <= first + len(data):
                return data[start - first: stop - first]
        raise ShortRead(f"{self.url}: bytes [{start}, {stop}) missing from a multipart answer")


class FsspecSource(ByteSource):
    """Any other fsspec filesystem (``s3://``, ``gs://``, ``memory://``...): the size and ETag from
    ``info``, each range by ``cat_file``; on S3 every range is asked with ``IfMatch`` (the object
    ETag at opening)."""

    def __init__(self, url: str, storage_options: Optional[dict] = None, *, fs=None, size: Optional[int] = None,
                 etag: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT):
        import fsspec

        options = dict(storage_options or {})
        if fs is None:
            fs, path = fsspec.core.url_to_fs(url, **options)
        else:
            path = fs._strip_protocol(url)
        self.fs, self.path, self.timeout = fs, path, float(timeout)
        protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
        self._s3 = "s3" in protocols
        if size is None:
            try:
                info = fs.info(path)
            except (FileNotFoundError, PermissionError):
                raise
            except Exception as exc:
                raise SourceUnavailable(f"{url}: {type(exc).__name__}: {exc}") from exc
            size, etag = info.get("size"), info.get("ETag", info.get("etag"))
            if size is None:
                raise SourceUnavailable(f"{url}: the store gives no size")
        self.ref = SourceRef(url, int(size), etag, tuple(sorted(options.items())))

    def fetch(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        self.requests += len(ranges)
        if self._s3:
            return _run(self.fs.loop, _bounded([self._s3_range(start, stop) for start, stop in ranges]), self.timeout)
        try:
            answers = [self.fs.cat_file(self.path, start=start, end=stop) for start, stop in ranges]
        except (FileNotFoundError, PermissionError):
            raise
        except Exception as exc:
            raise SourceUnavailable(f"{self.ref.url}: {type(exc).__name__}: {exc}") from exc
        return [_check_range(self.ref.url, start, stop, data) for (start, stop), data in zip(ranges, answers)]

    async def _s3_range(self, start: int, stop: int) -> bytes:
        import asyncio

        bucket, key, version = self.fs.split_path(self.path)
        extra = {"IfMatch": self.ref.etag} if self.ref.etag else {}
        if version:
            extra["VersionId"] = version
        try:
            answer = await asyncio.wait_for(self.fs._call_s3("get_object", Bucket=bucket, Key=key,
                                                             Range=f"bytes={start}-{stop - 1}", **extra),
                                            self.timeout)
        except FileNotFoundError:
            raise
        except Exception as exc:
            if "PreconditionFailed" in str(exc) or "412" in str(exc):
                raise SourceChanged(f"{self.ref.url}: its ETag is no longer {self.ref.etag}") from None
            raise
        total = str(answer.get("ContentRange", "")).rpartition("/")[2]
        if total.isdigit() and int(total) != self.ref.size:
            raise SourceChanged(f"{self.ref.url}: {total} bytes, {self.ref.size} when opened")
        body = answer["Body"]
        try:
            data = await asyncio.wait_for(body.read(), self.timeout)
        finally:
            body.close()
        return _check_range(self.ref.url, start, stop, data)


class MemorySource(ByteSource):
    """Bytes in memory as a :class:`ByteSource` (named ``url``): what a reader by range does,
    without a network."""

    def __init__(self, data, url: str = "memory"):
        self.data = bytes(data)
        self.ref = SourceRef(url, len(self.data))

    def fetch(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        self.requests += len(ranges)
        return [_check_range(self.ref.url, start, stop, self.data[start:stop]) for start, stop in ranges]


PREAD_BYTES = 1 << 30
"""The most bytes one ``os.pread`` of a :class:`LocalFileSource` asks for (a longer range is read in
several; Linux answers at most about 2 GiB per call anyway)."""


def _stamp(status: os.stat_result) -> tuple[int, int]:
    """What says a file is the one opened: its size and modification time (ns).  The inode is not
    compared: ``fstat`` of one descriptor always names the same one."""
    return status.st_size, status.st_mtime_ns


class LocalFileSource(ByteSource):
    """A local file as a :class:`ByteSource`, never mapped: opened read-only once (``O_RDONLY |
    O_CLOEXEC``), each range read by ``os.pread`` on that descriptor (partial reads continued).
    ``ref`` is the absolute path and the size at open.

    Before and after each batch of reads the descriptor's ``fstat`` is compared with the one at
    open: another size or modification time raises :class:`~hurray_schema.errors.SourceChanged`;
    a read that comes up short (the file cut during the read) :class:`~hurray_schema.errors.ShortRead`,
    an I/O error :class:`~hurray_schema.errors.SourceUnavailable`.  ``size``: the size the file must
    have (a :class:`SourceRef` opened again), else SourceChanged at once.  :meth:`close` releases
    the descriptor (again: nothing); a read after it raises SourceUnavailable."""

    range_cost = PART_COST  # one more pread

    def __init__(self, path, *, size: Optional[int] = None):
        self.path = os.path.abspath(os.fsdecode(path))
        self.requests = 0
        self._fd: Optional[int] = None
        self._lock = threading.Lock()  # a read and close() never overlap: the descriptor is not reused under a read
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            status = os.fstat(fd)
            if stat.S_ISDIR(status.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), self.path)
            if size is not None and status.st_size != size:
                raise SourceChanged(f"{self.path}: {status.st_size} bytes, {size} when opened")
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._stamp = fd, _stamp(status)
        self.ref = SourceRef(self.path, status.st_size)

    @classmethod
    def adopt(cls, fd: int, name: str) -> "LocalFileSource":
        """A source reading the open descriptor ``fd`` (a memory file with no path), which it takes
        over (:meth:`close` closes it); ``name`` names it in errors and in ``ref``."""
        self = cls.__new__(cls)
        self.path, self.requests, self._lock = name, 0, threading.Lock()
        status = os.fstat(fd)
        self._fd, self._stamp = fd, _stamp(status)
        self.ref = SourceRef(name, status.st_size)
        return self

    @property
    def closed(self) -> bool:
        return self._fd is None

    def fileno(self) -> int:
        """The descriptor the ranges are read from (for ``sendfile``, ``os.pread``); valid until :meth:`close`."""
        fd = self._fd
        if fd is None:
            raise SourceUnavailable(f"{self.path}: the source was closed")
        return fd

    def close(self) -> None:
        """Release the descriptor; closing again does nothing."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def fetch(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Each ``(start, stop)`` read whole, the file checked unchanged before and after."""
        ranges = list(ranges)
        with self._lock:
            fd = self.fileno()
            self._check_unchanged(fd)
            self.requests += len(ranges)
            answers = [self._read(fd, start, stop) for start, stop in ranges]
            self._check_unchanged(fd)
        return answers

    def _check_unchanged(self, fd: int) -> None:
        """SourceChanged if the file's size or modification time is not what it was at open."""
        try:
            now = _stamp(os.fstat(fd))
        except OSError as exc:
            raise SourceUnavailable(f"{self.path}: fstat: {exc.strerror or exc}") from exc
        if now != self._stamp:
            (size, mtime), (was_size, was_mtime) = now, self._stamp
            what = (f"{size} bytes, {was_size} when opened" if size != was_size
                    else f"modified since it was opened (mtime {mtime} ns, {was_mtime} ns then)")
            raise SourceChanged(f"{self.path}: {what}")

    def _read(self, fd: int, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` by ``os.pread``, partial reads continued; the file ending first is a ShortRead."""
        parts, at = [], start
        while at < stop:
            try:
                data = os.pread(fd, min(stop - at, PREAD_BYTES), at)
            except OSError as exc:
                raise SourceUnavailable(f"{self.path}: reading bytes [{start}, {stop}): {exc.strerror or exc}") from exc
            if not data:
                raise ShortRead(f"{self.path}: bytes [{start}, {stop}) cut off after {at - start} bytes "
                                "(the file ends there)")
            parts.append(data)
            at += len(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)


def open_source(url, storage_options: Optional[dict] = None, *, timeout: float = DEFAULT_TIMEOUT) -> ByteSource:
    """The :class:`ByteSource` of a URL (the ``[remote]`` extra) or of an open fsspec file."""
    try:
        import fsspec  # noqa: F401
    except ImportError:
        raise HurraySchemaError("reading a URL needs fsspec: pip install 'hurray_schema[remote]'") from None
    if not isinstance(url, str):  # an open fsspec file
        fs, path = url.fs, url.path
        protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
        if protocol in ("http", "https"):
            return HttpSource(path, storage_options, timeout=timeout)
        return FsspecSource(fs.unstrip_protocol(path), storage_options, fs=fs, timeout=timeout)
    if url.split("://", 1)[0] in ("http", "https"):
        return HttpSource(url, storage_options, timeout=timeout)
    return FsspecSource(url, storage_options, timeout=timeout)


def _source_of(ref: SourceRef, timeout: float) -> ByteSource:
    """The source ``ref`` names, opened again: a local absolute path by :class:`LocalFileSource`
    (no fsspec), a URL by HTTP or fsspec."""
    if "://" not in ref.url and os.path.isabs(ref.url):
        return LocalFileSource(ref.url, size=ref.size)
    if ref.url.split("://", 1)[0] in ("http", "https"):
        return HttpSource(ref.url, ref.options, size=ref.size, etag=ref.etag, timeout=timeout)
    return FsspecSource(ref.url, ref.options, size=ref.size, etag=ref.etag, timeout=timeout)


_READERS: dict = {}
_READERS_LOCK = threading.Lock()


def register(reader: "RangeReader") -> None:
    """Make ``reader`` this process's reader of its file unless one is there already (items
    unpickled in the process that opened the file share its cache)."""
    with _READERS_LOCK:
        _READERS.setdefault(reader.ref.key, reader)


def reader_for(ref: SourceRef, *, timeout: float = DEFAULT_TIMEOUT) -> "RangeReader":
    """This process's :class:`RangeReader` of ``ref`` (one per file: tasks and unpickled items
    of one file share its connections and its block cache)."""
    with _READERS_LOCK:
        reader = _READERS.get(ref.key)
        if reader is None or getattr(reader.source, "closed", False):
            reader = _READERS[ref.key] = RangeReader(_source_of(ref, timeout))
        return reader


def unregister(reader: "RangeReader") -> None:
    """Forget ``reader`` as its file's reader in this process, if it is (its source closed: an item
    unpickled later opens the file again)."""
    with _READERS_LOCK:
        if _READERS.get(reader.ref.key) is reader:
            del _READERS[reader.ref.key]


# --------------------------------------------------------------------------------------
# Ranges into requests
# --------------------------------------------------------------------------------------


class RangeReader:
    """Byte ranges of a :class:`ByteSource` as few requests, the requests of one call sent together.

    Two ways, by what is read:

    * small reads -- :meth:`read` of at most a quarter of ``cache_bytes`` (the walk over the
      sections and descriptors), and :meth:`fill` of under a sixteenth of a block within about one
      block (an element, a short row) -- are rounded out to whole ``block_size`` blocks, blocks at
      most ``merge_gap`` bytes apart fetched by one request, and kept in a least-recently-used
      cache of at most ``cache_bytes``: the next small read nearby costs no request;
    * every other :meth:`fill` (a box, a member, a whole buffer) takes what the cache and the
      pinned ranges hold already and fetches the rest exactly (:meth:`_bounded_runs`): ranges
      joined only while a run carries at most ``1 / RUN_SLACK`` more bytes than asked plus what one
      more range costs the source (:attr:`ByteSource.range_cost`), so a box read of a partition
      fetches its members' bytes in the box and about nothing else.

    ``requests`` and ``bytes_fetched`` count what was asked of the source."""

    def __init__(self, source: ByteSource, *, block_size: int = DEFAULT_BLOCK_SIZE,
                 cache_bytes: int = DEFAULT_CACHE_BYTES, merge_gap: Optional[int] = None):
        if block_size < 1 or cache_bytes < 0:
            raise HurraySchemaError("block_size must be positive and cache_bytes not negative")
        self.source = source
        self.block_size = int(block_size)
        self.cache_bytes = int(cache_bytes)
        self.merge_gap = self.block_size if merge_gap is None else int(merge_gap)
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._held = 0
        self._pins_at: list[int] = []
        self._pins: list[bytes] = []
        self._lock = threading.RLock()
        self.requests = 0
        self.bytes_fetched = 0

    @property
    def size(self) -> int:
        return self.source.size

    @property
    def ref(self) -> SourceRef:
        return self.source.ref

    def _check(self, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= self.size:
            raise HurraySchemaError(f"bytes [{start}, {stop}) lie outside the {self.size}-byte file {self.ref.url}")

    def _runs(self, spans: list[tuple[int, int]], gap: Optional[int] = None) -> list[tuple[int, int]]:
        """``spans`` (sorted or not) as the requests that fetch them: overlapping spans and spans at
        most ``gap`` (default ``merge_gap``) apart joined."""
        gap = self.merge_gap if gap is None else gap
        runs: list[list[int]] = []
        for start, stop in sorted(spans):
            if runs and start - runs[-1][1] <= gap:
                runs[-1][1] = max(runs[-1][1], stop)
            else:
                runs.append([start, stop])
        return [(start, stop) for start, stop in runs]

    def _fetch(self, runs: list[tuple[int, int]]) -> list[bytes]:
        if not runs:
            return []
        before = self.source.requests
        answers = self.source.fetch(runs)
        self.requests += len(runs) if (asked := self.source.requests - before) <= 0 else asked
        self.bytes_fetched += sum(stop - start for start, stop in runs)
        return answers

    def _blocks_of(self, start: int, stop: int) -> range:
        return range(start // self.block_size, -(-stop // self.block_size))

    def _block_span(self, block: int) -> tuple[int, int]:
        return block * self.block_size, min(self.size, (block + 1) * self.block_size)

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Have the blocks of every ``(start, stop)`` in the cache (those missing fetched together)."""
        with self._lock:
            wanted = sorted({b for start, stop in ranges if stop > start for b in self._blocks_of(start, stop)})
            missing = [b for b in wanted if b not in self._blocks]
            if not missing:
                return
            runs = self._runs([self._block_span(b) for b in missing])
            for (start, stop), data in zip(runs, self._fetch(runs)):
                for b in self._blocks_of(start, stop):
                    first, last = self._block_span(b)
                    self._keep(b, data[first - start: last - start])

    def pin(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Fetch ``ranges`` exactly -- not rounded to blocks; ranges at most a sixteenth of a block
        apart joined -- and keep them as long as the reader (what opening a file reads: its header
        and descriptors, with the tensors of a few KiB between them; a partition's larger members
        stay out).  A range the block cache holds whole (the file's tail, read first) is taken from
        it.  One batch of requests."""
        with self._lock:
            wanted = []
            for start, stop in ranges:
                if stop <= start or self._pinned(start, stop) is not None:
                    continue
                cached = self._cached(start, stop)
                if cached is None:
                    wanted.append((start, stop))
                else:
                    self._keep_pinned(start, cached)
            runs = self._runs(wanted, self.block_size // 16)
            for (start, stop), data in zip(runs, self._fetch(runs)):
                self._keep_pinned(start, data)

    def _keep_pinned(self, start: int, data: bytes) -> None:
        at = bisect.bisect_left(self._pins_at, start)
        self._pins_at.insert(at, start)
        self._pins.insert(at, data)

    def _cached(self, start: int, stop: int) -> Optional[bytes]:
        """Bytes ``[start, stop)`` when the block cache holds every block of them, else None."""
        parts = []
        for b in self._blocks_of(start, stop):
            data = self._blocks.get(b)
            if data is None:
                return None
            first, _ = self._block_span(b)
            parts.append(memoryview(data)[max(start, first) - first: min(stop, first + len(data)) - first])
        return b"".join(parts)

    def _pinned(self, start: int, stop: int) -> Optional[memoryview]:
        at = bisect.bisect_right(self._pins_at, start) - 1
        if at >= 0 and stop <= self._pins_at[at] + len(self._pins[at]):
            first = self._pins_at[at]
            return memoryview(self._pins[at])[start - first: stop - first]
        return None

    def _keep(self, block: int, data: bytes) -> None:
        if block in self._blocks:
            self._blocks.move_to_end(block)
            return
        self._blocks[block] = data
        self._held += len(data)
        while self._held > self.cache_bytes and self._blocks:
            _, dropped = self._blocks.popitem(last=False)
            self._held -= len(dropped)

    def read(self, start: int, stop: int) -> memoryview:
        """Bytes ``[start, stop)`` of the file."""
        self._check(start, stop)
        if stop == start:
            return memoryview(b"")
        pinned = self._pinned(start, stop)
        if pinned is not None:
            return pinned
        if stop - start > self.cache_bytes // 4:
            out = bytearray(stop - start)
            self.fill([(start, stop, memoryview(out))])
            return memoryview(out)
        with self._lock:
            self.prefetch([(start, stop)])
            parts = []
            for b in self._blocks_of(start, stop):
                first, _ = self._block_span(b)
                data = self._blocks.get(b)
                if data is None:  # evicted by this very read (a cache smaller than the read)
                    data = self._fetch([self._block_span(b)])[0]
                else:
                    self._blocks.move_to_end(b)
                parts.append(memoryview(data)[max(start, first) - first: min(stop, first + len(data)) - first])
        return parts[0] if len(parts) == 1 else memoryview(b"".join(parts))

    def fill(self, targets: Sequence[tuple[int, int, Any]]) -> None:
        """Copy bytes ``[start, stop)`` of the file into ``destination`` (a writable buffer of
        ``stop - start`` bytes) for each ``(start, stop, destination)``: what the pinned ranges and
        the block cache hold copied from them; the rest, if small and within about one block,
        through the block cache, else fetched exactly in bounded runs (:meth:`_bounded_runs`) and
        copied straight."""
        targets = [(start, stop, dest) for start, stop, dest in targets if stop > start]
        for start, stop, _ in targets:
            self._check(start, stop)
        with self._lock:
            targets = self._take_held(targets)
            if not targets:
                return
            total = sum(stop - start for start, stop, _ in targets)
            blocks = {b for start, stop, _ in targets for b in self._blocks_of(start, stop)}
            if self._small(total, len(blocks)):
                self.prefetch([(start, stop) for start, stop, _ in targets])
                for start, stop, dest in targets:
                    dest[:] = self.read(start, stop)
                return
            runs = self._bounded_runs([(start, stop) for start, stop, _ in targets])
            answers = self._fetch(runs)
        self._copy(targets, runs, answers)

    def _small(self, total: int, blocks: int) -> bool:
        """Whether a fill of ``total`` bytes over ``blocks`` blocks goes through the block cache: under
        a sixteenth of a block, its blocks mostly bytes it asks for or a single one, and a cache
        that holds a block."""
        return (total < self.block_size // 16 and blocks * self.block_size <= 4 * total + self.block_size
                and self.cache_bytes >= self.block_size)

    def _take_held(self, targets: list) -> list:
        """``targets`` less what the pinned ranges and the cached blocks hold, which is copied into
        their destinations now: the pieces still to fetch, as ``(start, stop, destination)``."""
        rest = []
        for start, stop, dest in targets:
            pinned = self._pinned(start, stop)
            if pinned is not None:
                dest[:] = pinned
                continue
            rest.extend(self._from_blocks(start, stop, dest))
        return rest

    def _from_blocks(self, start: int, stop: int, dest) -> list:
        """Bytes ``[start, stop)`` copied into ``dest`` from the cached blocks holding them; the
        pieces no cached block holds, as ``(start, stop, part of dest)``."""
        if not self._blocks:
            return [(start, stop, dest)]
        missing: list = []
        for b in self._blocks_of(start, stop):
            first, last = self._block_span(b)
            low, high = max(start, first), min(stop, last)
            data = self._blocks.get(b)
            if data is not None:
                dest[low - start: high - start] = memoryview(data)[low - first: high - first]
            elif missing and missing[-1][1] == low:
                missing[-1][1] = high
            else:
                missing.append([low, high])
        return [(low, high, dest[low - start: high - start]) for low, high in missing]

    def _bounded_runs(self, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """``spans`` as the ranges that fetch them: overlapping and touching spans joined, and the
        next span joined over a gap while the run stays within ``1 / RUN_SLACK`` of the bytes it
        holds plus one range's cost (:attr:`ByteSource.range_cost`): every run's bytes not asked
        for are bounded by what asking for them separately would cost."""
        cost = int(getattr(self.source, "range_cost", RANGE_COST))
        runs: list[list[int]] = []  # [start, stop, bytes asked]
        for start, stop in sorted(spans):
            if runs:
                run = runs[-1]
                if start <= run[1]:
                    run[2] += max(0, stop - run[1])
                    run[1] = max(run[1], stop)
                    continue
                asked = run[2] + stop - start
                if (stop - run[0]) - asked <= asked // RUN_SLACK + cost:
                    run[1], run[2] = stop, asked
                    continue
            runs.append([start, stop, stop - start])
        return [(start, stop) for start, stop, _ in runs]

    @staticmethod
    def _copy(targets, runs, answers) -> None:
        """Each target's bytes out of the run holding them."""
        starts = [start for start, _ in runs]
        for start, stop, dest in targets:
            at = bisect.bisect_right(starts, start) - 1
            run_start, _ = runs[at]
            dest[:] = memoryview(answers[at])[start - run_start: stop - run_start]


class SourceView:
    """A file read through a :class:`RangeReader`, as the file walk reads a ``memoryview``:
    ``len(view)`` and ``view[start:stop]`` (a ``memoryview`` of those bytes)."""

    __slots__ = ("reader",)

    def __init__(self, reader: RangeReader):
        self.reader = reader

    def __len__(self) -> int:
        return self.reader.size

    def __getitem__(self, index):
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("a SourceView is read by unit-step slices")
        start, stop, _ = index.indices(self.reader.size)
        return self.reader.read(start, max(start, stop))


# --------------------------------------------------------------------------------------
# A tensor's buffers, fetched as they are read
# --------------------------------------------------------------------------------------


def _subtract(have: list[tuple[int, int]], start: int, stop: int) -> list[tuple[int, int]]:
    """The parts of ``[start, stop)`` not in the sorted disjoint spans ``have`` (those ending before
    ``start`` skipped by bisection: a box read of many rows asks this for each row)."""
    missing, at = [], start
    skip = bisect.bisect_right(have, (start, start)) - 1  # the last span starting at or before start
    for first, last in have[max(skip, 0):]:
        if last <= at:
            continue
        if first >= stop:
            break
        if first > at:
            missing.append((at, first))
        at = max(at, last)
    if at < stop:
        missing.append((at, stop))
    return missing


def merged_spans(spans) -> list[tuple[int, int]]:
    """``(start, stop)`` spans sorted, overlapping and touching ones joined."""
    merged: list[list[int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return [(a, b) for a, b in merged]


class SourcedBuffers:
    """One tensor's buffers in a file read by range: ``ranges`` (file offset, size) per buffer.
    Each buffer is an anonymous mapping of its size, made on first use (:meth:`views`, or the
    first fetch into it: opening a file of many tensors maps nothing); :meth:`ensure` fetches the
    spans a read needs into it (each byte once), :meth:`views` hands the mappings to the evaluator."""

    __slots__ = ("reader", "ranges", "_maps", "_views", "_have", "_lock")

    def __init__(self, reader: RangeReader, ranges: Sequence[tuple[int, int]]):
        self.reader = reader
        self.ranges = tuple((int(offset), int(size)) for offset, size in ranges)
        for offset, size in self.ranges:
            reader._check(offset, offset + size)
        self._maps: Optional[list] = None
        self._views: Optional[tuple] = None
        self._have: list[list[tuple[int, int]]] = [[] for _ in self.ranges]
        self._lock = threading.Lock()

    def views(self) -> tuple:
        """A ``memoryview`` of each buffer's mapping (an empty buffer: of no bytes), the mappings made now
        if they were not yet."""
        views = self._views
        if views is None:
            with self._lock:
                if self._views is None:
                    self._maps = [mmap.mmap(-1, size) if size else None for _, size in self.ranges]
                    self._views = tuple(memoryview(m) if m is not None else memoryview(b"") for m in self._maps)
                views = self._views
        return views

    def missing(self, spans) -> list[tuple[int, int, Any]]:
        """``(file start, file stop, destination)`` of what ``spans`` (``(buffer, start, stop)``)
        need and the mappings do not hold yet."""
        out = []
        for index, start, stop in spans:
            offset, size = self.ranges[index]
            start, stop = max(0, int(start)), min(size, int(stop))
            if stop <= start:
                continue
            for first, last in _subtract(self._have[index], start, stop):
                out.append((offset + first, offset + last, (self, index, first, last)))
        return out

    def _filled(self, index: int, spans: list[tuple[int, int]]) -> None:
        """Note the byte spans ``(first, last)`` of buffer ``index`` as held (all at once: a box of
        many rows adds thousands)."""
        self._have[index] = merged_spans(self._have[index] + spans)

    def ensure(self, spans) -> None:
        """Fetch the spans ``(buffer, start, stop)`` not held yet (one batch of requests)."""
        fill_all([(self, spans)])

    def ensure_all(self) -> None:
        self.ensure([(i, 0, size) for i, (_, size) in enumerate(self.ranges)])

    def __reduce__(self):
        return _reopen_buffers, (self.reader.ref, self.ranges)


def fill_all(requests) -> None:
    """For each ``(buffers, spans)``: the spans not held fetched into ``buffers``, every
    buffers of one reader in one batch of requests."""
    by_reader: dict[int, list] = {}
    for buffers, spans in requests:
        by_reader.setdefault(id(buffers.reader), []).append((buffers, spans))
    for group in by_reader.values():
        reader = group[0][0].reader
        with reader._lock:
            wants = [want for buffers, spans in group for want in buffers.missing(spans)]
            if not wants:
                continue
            reader.fill([(start, stop, buffers.views()[index][first:last])
                         for start, stop, (buffers, index, first, last) in wants])
            filled: dict[tuple[int, int], tuple] = {}
            for _, _, (buffers, index, first, last) in wants:
                filled.setdefault((id(buffers), index), (buffers, []))[1].append((first, last))
            for (_, index), (buffers, spans) in filled.items():
                buffers._filled(index, spans)


def _reopen_buffers(ref: SourceRef, ranges) -> SourcedBuffers:
    return SourcedBuffers(reader_for(ref), ranges)


@attrs.frozen(slots=True)
class RemoteBuffers:
    """A tensor's buffers in a file read by range, as a dask task finds them: the file's
    :class:`SourceRef` and ``(offset, size)`` per buffer (the remote twin of
    :class:`hurray_schema.evaluate.dask_graph.FileBuffers`)."""

    ref: SourceRef
    ranges: tuple

    def open(self) -> SourcedBuffers:
        """The buffers, nothing fetched yet (the task's :func:`read_chunk` ensures what it reads)."""
        return SourcedBuffers(reader_for(self.ref), self.ranges)
