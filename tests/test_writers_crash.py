"""Writers killed outright leave nothing behind (hurray_schema/io/_write.py ``replacing``).

A ``save`` SIGKILLed while it writes leaves the target as it was, and at most a temporary file
that the next write to the folder removes -- none at all while the temporary file is unnamed
(``O_TMPFILE``).  The next write removes only temporary files of our own name pattern whose
``flock`` it can take: never a live writer's, never another file.  Every test runs with the
unnamed temporary file and with the named fallback (``_write.USE_O_TMPFILE``).

The killed writers are pinned: the child announces where it is, then waits to be killed, so
the kill lands mid-write on every run.  One test kills a writer left running instead.
"""

from __future__ import annotations

import errno
import os
import queue
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.conversion import _Spill
from hurray_schema.io import StreamWriter, Tensor, read_stream
from hurray_schema.io import _write

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not os.path.isdir("/proc/self/fd"),
                                reason="SIGKILL, flock and /proc/<pid>/fd: Linux only")

TEMPORARY = re.compile(r"\..+\.[0-9]+\.[0-9a-f]{12}\.hrry-tmp\Z")
BIG_MIB = 128
"""What the killed writers write: four float32 arrays of 32 MiB."""
HALF = BIG_MIB * 2**20 // 2
WAIT = 180
"""The most seconds any wait on a child lasts (a bound, not a measurement)."""


def _o_tmpfile_works(folder) -> bool:
    if not hasattr(os, "O_TMPFILE"):
        return False
    try:
        os.close(os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o600))
    except OSError:
        return False
    return True


@pytest.fixture
def folder(tmp_path):
    """A fresh folder, removed with all it holds afterwards (the killed writers write 128 MiB)."""
    path = tmp_path / "out"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["unnamed", "named"])
def mode(request, folder, monkeypatch):
    """The kind of temporary file ``replacing`` writes into, in this process."""
    if request.param == "unnamed" and not _o_tmpfile_works(folder):
        pytest.skip("no O_TMPFILE on this file system")
    monkeypatch.setattr(_write, "USE_O_TMPFILE", request.param == "unnamed")
    return request.param


def _temporaries(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if TEMPORARY.fullmatch(name))


OLD = {"old": np.arange(1000, dtype=np.int32), "bias": np.full(7, 2.5, np.float16)}


def _same(got: dict, want: dict) -> bool:
    return sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)


# --------------------------------------------------------------------------------------
# Writers killed with SIGKILL
# --------------------------------------------------------------------------------------

CHILD = textwrap.dedent(f"""
    import os, sys
    import numpy as np
    import hurray_schema as hs
    from hurray_schema.io import _write

    path, mode, pin = sys.argv[1:4]
    _write.USE_O_TMPFILE = mode == "unnamed"
    count = {BIG_MIB} * 2**20 // 4 // 4
    arrays = {{f"big{{i}}": np.full(count, i + 1, np.float32) for i in range(4)}}

    def stop(where):
        print(where, flush=True)
        sys.stdin.read()  # the parent kills us here
        os._exit(3)  # stdin closed instead: still never finish the write

    if pin == "writing":  # half of the file written
        real_write = _write.Sink.write

        def write(self, data):
            real_write(self, data)
            if self.f is not None and self.pos >= {HALF}:
                stop("writing")

        _write.Sink.write = write
    elif pin == "renaming":  # all of it written and fsynced, about to be renamed
        real_replace, target = os.replace, os.path.realpath(path)

        def replace(src, dst, *args, **kwargs):
            if os.fspath(dst) == target:
                stop("renaming")
            real_replace(src, dst, *args, **kwargs)

        os.replace = replace
    print("saving", flush=True)
    hs.save(path, arrays)
    print("saved", flush=True)
""")

NEW = {f"big{i}": np.full(BIG_MIB * 2**20 // 16, i + 1, np.float32) for i in range(4)}


class Child:
    """A subprocess whose stdout lines arrive in a queue (so every wait has a bound)."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-c", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def expect(self, want: str) -> None:
        try:
            got = self.lines.get(timeout=WAIT)
        except queue.Empty:
            got = "(nothing)"
        if got != want:
            self.kill()
            pytest.fail(f"the child said {got!r}, not {want!r}: {self.proc.stderr.read()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=WAIT)

    def release(self) -> None:
        """Let a child blocked on its stdin go on."""
        self.proc.stdin.close()
        self.proc.wait(timeout=WAIT)

    def close(self) -> None:
        self.kill()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            stream.close()


def _open_in(pid: int, folder) -> list[tuple[str, int]]:
    """What process ``pid`` holds open in ``folder`` (regular files), with each one's size;
    an unnamed file shows as ``folder/#<inode> (deleted)``."""
    folder = os.path.realpath(folder) + os.sep
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith(folder) and stat.S_ISREG(st.st_mode):
            found.append((link[len(folder):], st.st_size))
    return found


def _check_after_kill(folder, target, old: bool, left: int) -> None:
    """The target as it was; ``left`` temporary files, gone after the next save to the folder."""
    if old:
        assert _same(hs.load(target), OLD)
    else:
        assert not target.exists()
    assert len(_temporaries(folder)) == left
    hs.save(folder / "next.hrry", {"x": np.arange(3)})
    assert sorted(os.listdir(folder)) == sorted(["next.hrry"] + (["model.hrry"] if old else []))


@pytest.mark.parametrize("pin", ["writing", "renaming"])
@pytest.mark.parametrize("old", [False, True], ids=["no-target", "old-target"])
def test_a_writer_killed_mid_write_leaves_the_target_whole(folder, mode, pin, old):
    target = folder / "model.hrry"
    if old:
        hs.save(target, OLD)
    child = Child(CHILD, str(target), mode, pin)
    try:
        child.expect("saving")
        child.expect(pin)
        held = _open_in(child.proc.pid, folder)
        assert len(held) == 1  # it is writing the temporary file
        name, size = held[0]
        assert size >= HALF
        # unnamed: no name until the link just before the rename (the descriptor keeps
        # showing the first, deleted one); named: a name from the start
        left = 0 if mode == "unnamed" and pin == "writing" else 1
        temporaries = _temporaries(folder)
        assert len(temporaries) == left and all(f".{child.proc.pid}." in t for t in temporaries)
        assert name.endswith(" (deleted)") if mode == "unnamed" else [name] == temporaries
        assert _write.remove_orphans(folder) == []  # the writer is alive: its file stays
        child.kill()
    finally:
        child.close()
    _check_after_kill(folder, target, old, left)


def test_a_writer_killed_as_it_goes_leaves_a_whole_file(folder, mode):
    """Not pinned: killed once its temporary file has grown, or finished before that."""
    target = folder / "model.hrry"
    hs.save(target, OLD)
    child = Child(CHILD, str(target), mode, "none")
    try:
        child.expect("saving")
        deadline = time.monotonic() + WAIT
        while child.proc.poll() is None and time.monotonic() < deadline:
            if any(size > 0 for _, size in _open_in(child.proc.pid, folder)):
                break
            time.sleep(0.002)
        child.kill()
    finally:
        child.close()
    got = hs.load(target)
    assert _same(got, OLD) or _same(got, NEW)
    assert len(_temporaries(folder)) <= 1  # one only if killed between naming and renaming
    hs.save(folder / "next.hrry", {"x": np.arange(3)})
    assert sorted(os.listdir(folder)) == ["model.hrry", "next.hrry"]


# --------------------------------------------------------------------------------------
# Orphans removed, nothing else
# --------------------------------------------------------------------------------------

ORPHAN = ".model.hrry.4242.0123456789ab.hrry-tmp"
NOT_OURS = ["notes.txt", ".model.hrry.0123456789ab.tmp", "model.hrry-tmp", ".model.hrry.12.0123456789AB.hrry-tmp",
            ".model.hrry.12.0123456789ab.hrry-tmp.bak", ".model.hrry.x.0123456789ab.hrry-tmp"]


def test_a_dead_writers_temporary_is_removed_and_nothing_else(folder, mode):
    (folder / ORPHAN).write_bytes(b"half a file")
    for name in NOT_OURS:
        (folder / name).write_bytes(b"keep me")
    (folder / ".dir.1.0123456789ab.hrry-tmp").mkdir()  # our pattern, but not a file
    (folder / ".link.1.0123456789ab.hrry-tmp").symlink_to("notes.txt")  # never followed
    hs.save(folder / "model.hrry", OLD)
    assert not (folder / ORPHAN).exists()
    assert all((folder / name).read_bytes() == b"keep me" for name in NOT_OURS)
    assert (folder / ".dir.1.0123456789ab.hrry-tmp").is_dir()
    assert (folder / ".link.1.0123456789ab.hrry-tmp").is_symlink()
    assert _same(hs.load(folder / "model.hrry"), OLD)


LOCKER = textwrap.dedent("""
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    sys.stdin.read()
""")


def test_a_live_writers_temporary_is_kept(folder, mode):
    held = folder / ORPHAN
    child = Child(LOCKER, str(held))
    try:
        child.expect("locked")
        hs.save(folder / "model.hrry", OLD)
        assert _write.remove_orphans(folder) == []
        assert held.exists()
        child.release()  # the holder ends: its file is an orphan now
    finally:
        child.close()
    hs.save(folder / "model.hrry", OLD)
    assert sorted(os.listdir(folder)) == ["model.hrry"]


def test_a_temporary_open_in_this_process_is_kept(folder, mode):
    """A lock is per open file: this process's own writer is as alive as another's."""
    with StreamWriter(folder / "a.stream") as writer:
        writer.write(np.arange(5, dtype=np.int16))
        during = _temporaries(folder)
        hs.save(folder / "b.hrry", OLD)
        assert _temporaries(folder) == during and len(during) == (mode == "named")
        writer.write(np.arange(3, dtype=np.int16))
    assert sorted(os.listdir(folder)) == ["a.stream", "b.hrry"]
    with open(folder / "a.stream", "rb") as f:
        assert [t.to_numpy().tolist() for t in read_stream(f)] == [list(range(5)), list(range(3))]


def test_a_sweep_between_creation_and_lock_makes_the_writer_start_again(folder, monkeypatch):
    """The named file is unlocked for a moment after it is made; a sweeper that removes it
    then leaves the writer an unlinked file, which it sees once locked."""
    monkeypatch.setattr(_write, "USE_O_TMPFILE", False)
    real_lock, calls = _write._lock, []

    def lock(fd):
        if not calls:  # a sweeper comes by the first time only
            calls.append(_write.remove_orphans(folder))
        real_lock(fd)
        calls.append(os.fstat(fd).st_nlink)

    monkeypatch.setattr(_write, "_lock", lock)
    hs.save(folder / "model.hrry", OLD)
    assert len(calls[0]) == 1 and calls[1:] == [0, 1]  # removed, found unlinked, made again
    assert sorted(os.listdir(folder)) == ["model.hrry"] and _same(hs.load(folder / "model.hrry"), OLD)


# --------------------------------------------------------------------------------------
# What replacing keeps doing, with either kind of temporary file
# --------------------------------------------------------------------------------------


def test_the_temporary_file_has_a_name_only_in_the_named_mode(folder, mode):
    with _write.replacing(folder / "model.hrry") as f:
        f.write(b"data")
        f.flush()
        names = _temporaries(folder)
        if mode == "unnamed":
            assert os.fstat(f.fileno()).st_nlink == 0 and names == []
        else:
            assert os.fstat(f.fileno()).st_nlink == 1 and len(names) == 1
            assert names[0].startswith(f".model.hrry.{os.getpid()}.")
    assert (folder / "model.hrry").read_bytes() == b"data" and os.listdir(folder) == ["model.hrry"]


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_an_exception_changes_nothing_and_leaves_nothing(folder, mode, exc):
    target = folder / "model.hrry"
    hs.save(target, OLD)
    before = target.read_bytes()
    with pytest.raises(type(exc)):
        with _write.replacing(target) as f:
            f.write(b"partial")
            raise exc
    assert target.read_bytes() == before and os.listdir(folder) == ["model.hrry"]


def test_a_failed_rename_leaves_nothing(folder, mode, monkeypatch):
    target = folder / "model.hrry"
    hs.save(target, OLD)

    def replace(src, dst):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError):
        hs.save(target, {"x": np.arange(4)})
    assert os.listdir(folder) == ["model.hrry"] and _same(hs.load(target), OLD)


def test_permissions_are_kept_and_links_followed(folder, mode):
    target = folder / "model.hrry"
    hs.save(target, OLD)
    os.chmod(target, 0o640)
    link = folder / "link.hrry"
    link.symlink_to(target.name)
    hs.save(link, {"x": np.arange(4)})
    assert link.is_symlink() and stat.S_IMODE(os.stat(target).st_mode) == 0o640
    assert hs.load(target)["x"].tolist() == [0, 1, 2, 3]
    assert sorted(os.listdir(folder)) == ["link.hrry", "model.hrry"]


def test_a_new_file_gets_the_mode_open_would_give_it(folder, mode):
    umask = os.umask(0o027)
    try:
        hs.save(folder / "model.hrry", OLD)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(folder / "model.hrry").st_mode) == 0o640


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL])
def test_a_refused_o_tmpfile_falls_back_to_a_named_file(folder, monkeypatch, code):
    if not hasattr(os, "O_TMPFILE"):
        pytest.skip("no O_TMPFILE here")
    monkeypatch.setattr(_write, "USE_O_TMPFILE", True)
    real_open = os.open

    def refusing(path, flags, *args, **kwargs):
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(code, os.strerror(code), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    with _write.replacing(folder / "model.hrry") as f:
        f.write(b"data")
        assert len(_temporaries(folder)) == 1 and os.fstat(f.fileno()).st_nlink == 1
    assert (folder / "model.hrry").read_bytes() == b"data" and os.listdir(folder) == ["model.hrry"]


def test_a_missing_folder_is_an_error(tmp_path, mode):
    with pytest.raises(FileNotFoundError):
        hs.save(tmp_path / "absent" / "model.hrry", OLD)


# --------------------------------------------------------------------------------------
# The conversion's spill file
# --------------------------------------------------------------------------------------


def test_the_conversion_spill_file_has_no_name(folder):
    spill = _Spill(str(folder), budget=0)
    try:
        kept = spill.keep(Tensor.from_numpy(np.arange(1000, dtype=np.float32)))
        assert spill.file is not None and os.fstat(spill.file.fileno()).st_nlink == 0
        assert os.listdir(folder) == []
        assert np.array_equal(kept.to_numpy(), np.arange(1000, dtype=np.float32))
        del kept
    finally:
        spill.close()
