"""Log files for Snakemake jobs that still show progress on the terminal."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


class _Tee:
    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, s: str) -> int:
        for st in self.streams:
            st.write(s)
            st.flush()
        return len(s)

    def flush(self) -> None:
        for st in self.streams:
            st.flush()


@contextlib.contextmanager
def tee_to(path: str | Path) -> Iterator[None]:
    """Copy stdout and stderr into `path` (and still to the terminal) for the block."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        old_out, old_err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(old_out, f), _Tee(old_err, f)
        try:
            yield
        except BaseException:
            import traceback

            traceback.print_exc()
            raise
        finally:
            sys.stdout, sys.stderr = old_out, old_err
