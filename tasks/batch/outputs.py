"""The result files of batches that pack many chunks, read once per process.

A batch packs the parts of many chunks (``tasks.batch.requests.wire_id``), so its output
and error files hold the answers of every chunk it packs; each chunk task needs only its
own lines. ``OUTPUTS.lines`` reads a file once, splits its lines by the chunk their
``custom_id`` names (a regular expression on the line, no JSON parse), and hands each
chunk its lines once (they are dropped when taken, the file when every chunk took its
lines; the last few files are kept). A chunk that asks again (a task retried) reads the
file again. Lines that name no chunk (a batch of one chunk made before parts were packed)
are handed to every chunk that asks. The batch stage clears it when a run starts.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["OUTPUTS", "OutputLines"]

_CHUNK = re.compile(rb'"custom_id"\s*:\s*"(\d+)\.\d+\.')
_KEPT_FILES = 4


@dataclass(slots=True)
class _Split:
    by_chunk: dict[int, list[bytes]] = field(default_factory=dict)
    unnamed: list[bytes] = field(default_factory=list)
    taken: set[int] = field(default_factory=set)


def _split(content: bytes) -> _Split:
    split = _Split()
    for line in content.splitlines():
        if not line.strip():
            continue
        found = _CHUNK.search(line)
        if found is None:
            split.unnamed.append(line)
        else:
            split.by_chunk.setdefault(int(found.group(1)), []).append(line)
    return split


class OutputLines:
    """Result files split by chunk, by ``(scope, file id)`` (``scope``: the provider's base
    URL: file ids are unique per provider only); thread-safe, each file read once at a
    time."""

    def __init__(self, *, kept_files: int = _KEPT_FILES) -> None:
        self._files: OrderedDict[tuple[str, str], _Split] = OrderedDict()
        self._lock = threading.Lock()
        self._reading: dict[tuple[str, str], threading.Lock] = {}
        self._kept = kept_files

    def lines(self, read: Callable[[str], bytes], scope: str, file_id: str, chunk: int) -> bytes:
        """Chunk ``chunk``'s lines of result file ``file_id`` (and the lines that name no
        chunk), read with ``read`` unless an earlier chunk read it.

        :raises: what ``read`` raises.
        """
        key = (scope, file_id)
        with self._lock:
            reading = self._reading.setdefault(key, threading.Lock())
        with reading:
            with self._lock:
                split = self._files.get(key)
                if split is not None and chunk in split.taken:
                    split = None  # asked again (a retried task): read again
            if split is None:
                split = _split(read(file_id))
                with self._lock:
                    self._files[key] = split
                    while len(self._files) > self._kept:
                        self._files.popitem(last=False)
            with self._lock:
                if key in self._files:
                    self._files.move_to_end(key)
                mine = split.by_chunk.pop(chunk, [])
                split.taken.add(chunk)
                if not split.by_chunk and not split.unnamed:
                    self._files.pop(key, None)
                    self._reading.pop(key, None)
        return b"\n".join(mine + split.unnamed) + b"\n"

    def clear(self) -> None:
        """Forget every file (a new run: a provider that reuses file ids, e.g. a local
        server restarted, never hands a chunk an earlier run's lines)."""
        with self._lock:
            self._files.clear()
            self._reading.clear()


#: The process's result files: chunk tasks of one process share them.
OUTPUTS = OutputLines()
