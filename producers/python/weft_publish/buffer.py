"""A bounded, append-only, fsync'd on-disk buffer of envelope lines, read back in order.

Why: while weft's gateway is unreachable, events must survive a process restart and must
reach weft in the order they were published. The buffer is a folder of segment files
(`seg-<n>.ndjson`, one JSON envelope per line) plus a `cursor` file naming how far the
oldest segment has been delivered. Appends are fsync'd before they count; the cursor is
replaced atomically (write, fsync, rename). A crash can therefore only cause a batch to be
sent twice, never lost; weft stores identical copies of an event once.

Only one process may use a folder at a time (an exclusive `flock` on `lock`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from dataclasses import dataclass

log = logging.getLogger("weft_publish")

_PREFIX = "seg-"
_SUFFIX = ".ndjson"


class BufferFull(Exception):
    """The on-disk buffer reached its size bound; the caller must slow down or stop."""


class BufferLocked(Exception):
    """Another process (or Publisher) already uses this buffer folder."""


@dataclass(frozen=True)
class Position:
    """Where a read ended: segment number and byte offset after the last line read."""

    segment: int
    offset: int


class DiskBuffer:
    """The on-disk buffer. Not thread-safe: one sender thread owns it."""

    def __init__(self, directory: str, max_bytes: int, segment_bytes: int = 1 << 20) -> None:
        """Open (or create) the buffer in `directory`, bounded to `max_bytes` of segments."""
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        os.makedirs(directory, exist_ok=True)
        self._lock = open(os.path.join(directory, "lock"), "a+")  # noqa: SIM115 - held open
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self._lock.close()
            raise BufferLocked(f"buffer folder {directory} is in use by another publisher") from exc
        self._segments = sorted(self._list_segments())
        self._sizes = {s: os.path.getsize(self._path(s)) for s in self._segments}
        self._cursor = self._read_cursor()
        # Never append to a segment left by an earlier process: its tail may be torn.
        self._write_seg = (self._segments[-1] + 1) if self._segments else 1
        self._write_file = None
        self._drop_consumed()

    # -- paths and state -------------------------------------------------------------
    def _path(self, seg: int) -> str:
        return os.path.join(self.directory, f"{_PREFIX}{seg:012d}{_SUFFIX}")

    def _list_segments(self) -> list[int]:
        out = []
        for name in os.listdir(self.directory):
            if name.startswith(_PREFIX) and name.endswith(_SUFFIX):
                try:
                    out.append(int(name[len(_PREFIX) : -len(_SUFFIX)]))
                except ValueError:
                    continue
        return out

    def _read_cursor(self) -> Position:
        try:
            with open(os.path.join(self.directory, "cursor"), encoding="utf-8") as f:
                d = json.load(f)
            return Position(int(d["segment"]), int(d["offset"]))
        except FileNotFoundError:
            return Position(self._segments[0] if self._segments else 0, 0)
        except (ValueError, KeyError, TypeError) as exc:
            # A torn cursor can only come from a crash mid-rename, which rename prevents;
            # replaying from the start of the oldest segment is the safe answer (duplicates).
            log.warning("weft_publish: unreadable buffer cursor (%s); replaying oldest segment", exc)
            return Position(self._segments[0] if self._segments else 0, 0)

    def _write_cursor(self, pos: Position) -> None:
        tmp = os.path.join(self.directory, "cursor.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"segment": pos.segment, "offset": pos.offset}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.directory, "cursor"))
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _drop_consumed(self) -> None:
        """Delete segments wholly before the cursor (and a finished, closed oldest one)."""
        changed = False
        while self._segments:
            s = self._segments[0]
            finished = s < self._cursor.segment or (
                s == self._cursor.segment and self._cursor.offset >= self._sizes.get(s, 0)
            )
            if not finished:
                break
            if s == self._write_seg and self._write_file is not None:
                # Everything written is delivered: the next append starts a new segment.
                self._write_file.close()
                self._write_file = None
                self._write_seg += 1
            os.remove(self._path(s))
            self._segments.pop(0)
            self._sizes.pop(s, None)
            changed = True
        if changed:
            self._fsync_dir()
        if self._segments and self._cursor.segment < self._segments[0]:
            self._cursor = Position(self._segments[0], 0)

    # -- public API --------------------------------------------------------------------
    @property
    def size_bytes(self) -> int:
        """Bytes held in segment files (delivered lines of the oldest segment included)."""
        return sum(self._sizes.values())

    def is_empty(self) -> bool:
        """True when every appended line has been delivered (committed)."""
        self._drop_consumed()
        if not self._segments:
            return True
        if len(self._segments) == 1:
            s = self._segments[0]
            return self._cursor.segment == s and self._cursor.offset >= self._sizes.get(s, 0)
        return False

    def append(self, lines: list[bytes]) -> None:
        """Append `lines` (each one JSON document, no newline) durably, in order.

        Raises BufferFull, appending nothing, when they do not fit under `max_bytes`, and
        OSError (a full or failing disk) when they could not be made durable: nothing of
        them counts as appended then, and the next append starts a new segment, so bytes
        a failed write may have left are never read back in this process (a later one reads
        them as a torn tail, or as copies of events that were appended again).
        """
        if not lines:
            return
        data = b"".join(line + b"\n" for line in lines)
        if self.size_bytes + len(data) > self.max_bytes:
            raise BufferFull(
                f"on-disk buffer {self.directory} is full ({self.size_bytes} of "
                f"{self.max_bytes} bytes); {len(lines)} events not accepted"
            )
        try:
            if self._write_file is None or self._sizes.get(self._write_seg, 0) >= self.segment_bytes:
                self._rotate()
            f = self._write_file
            assert f is not None
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        except OSError:
            self._abandon_segment()
            raise
        self._sizes[self._write_seg] = self._sizes.get(self._write_seg, 0) + len(data)

    def _abandon_segment(self) -> None:
        """After a failed write: stop appending to the current segment (its tail may hold
        part of the failed write, or get it when the file's buffer is flushed on close)."""
        if self._write_file is not None:
            try:
                self._write_file.close()
            except OSError:
                pass
            self._write_file = None
        self._write_seg += 1

    def _rotate(self) -> None:
        if self._write_file is not None:
            self._write_file.close()
            self._write_seg += 1
        path = self._path(self._write_seg)
        self._write_file = open(path, "ab")  # noqa: SIM115 - kept open for appends
        if self._write_seg not in self._sizes:
            self._segments.append(self._write_seg)
            self._sizes[self._write_seg] = 0
            self._fsync_dir()
        if not self._segments or self._cursor.segment == 0:
            self._cursor = Position(self._segments[0], 0)

    def read(self, max_items: int, max_bytes: int) -> tuple[list[bytes], Position]:
        """The oldest undelivered lines (at most `max_items` / about `max_bytes`), and the
        position to `commit` once they are delivered. Reads within one segment."""
        self._drop_consumed()
        if self.is_empty():
            return [], self._cursor
        seg = self._cursor.segment
        if seg not in self._sizes:
            seg = self._segments[0]
            self._cursor = Position(seg, 0)
        lines: list[bytes] = []
        offset = self._cursor.offset
        size = self._sizes[seg]
        total = 0
        with open(self._path(seg), "rb") as f:
            f.seek(offset)
            while offset < size and len(lines) < max_items and (total < max_bytes or not lines):
                line = f.readline()
                if not line:
                    break
                if not line.endswith(b"\n"):
                    # A torn tail from a crash mid-append: it was never acknowledged.
                    log.warning("weft_publish: skipping a torn line at the end of %s", self._path(seg))
                    offset += len(line)
                    break
                offset += len(line)
                body = line[:-1]
                if body.strip():
                    lines.append(body)
                    total += len(body)
        if not lines and offset >= size and seg != self._write_seg:
            # Nothing left in this segment: move on and read the next one.
            self.commit(Position(seg, offset))
            return self.read(max_items, max_bytes)
        return lines, Position(seg, offset)

    def commit(self, pos: Position) -> None:
        """Record that everything up to `pos` is delivered; free finished segments."""
        self._cursor = pos
        self._write_cursor(pos)
        self._drop_consumed()

    def close(self) -> None:
        """Close files and release the folder lock."""
        if self._write_file is not None:
            self._write_file.close()
            self._write_file = None
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_UN)
        finally:
            self._lock.close()
