"""One process at a time fetches a dataset into a folder.

Ray's clients, parallel runs and SuperNodes sharing a data folder can all find a dataset
missing at once; without a lock each downloads and extracts it into the same place and one
reads another's half-written file. `fetch_once(root, present, fetch)` takes an exclusive lock
on <root>/.fedgo-fetch.lock only when the dataset is missing: the first process fetches, the
others wait, look again and find it. A dataset already there is read without the lock. POSIX
only (fcntl); elsewhere no lock is taken."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

LOCK_NAME = ".fedgo-fetch.lock"


@contextmanager
def fetching(root: Path):
    """Held by one process at a time for the folder `root`."""
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        handle = open(Path(root) / LOCK_NAME, "a")
    except OSError:  # a folder it cannot write: the fetch fails there, naming the fix
        handle = None
    if handle is None:
        yield
        return
    with handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield


def fetch_once(root: Path, present: Callable[[], bool], fetch: Callable[[], None]) -> None:
    """fetch() unless present(), by one process at a time; the others find it present."""
    if present():
        return
    with fetching(root):
        if not present():
            fetch()
