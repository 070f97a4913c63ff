"""Text that cudalab read from outside, made safe where it is shown: on a console (control
characters escaped, so a name cannot move the cursor, forge a line or colour the terminal)
and in a CSV file (a cell that a spreadsheet would run as a formula is neutralised).

CSV, as OWASP recommends against CSV injection: a text cell that begins with =, +, -, @,
tab or CR gets a single quote in front, so a spreadsheet shows it as text. A cell that
already begins with a quote gets one more, so reading back (csv_text) removes exactly one
quote from every cell that begins with one and the round trip is exact. Numbers stay
numbers: only text cells change, and a text cell that is a plain number ("-1.5") is no
formula and is left as it is. write_frame writes a frame so (and quotes a cell holding a
bare CR, which would otherwise end its row for a reader).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas only where a frame is written: a console line needs none
    import pandas as pd

CSV_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
# Control (Cc), format (Cf: bidi overrides, zero-width marks), line and paragraph
# separators, lone surrogates: none of them may reach a terminal raw.
_UNSAFE_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs")


def printable(text: Any, keep_tabs: bool = False) -> str:
    """`text` with every control or format character escaped as Python writes it (\\n,
    \\x1b, \\u202e): one line that shows what the text holds and cannot drive a terminal."""
    s = str(text)
    if s.isprintable() and (keep_tabs or "\t" not in s):
        return s
    out = []
    for ch in s:
        if (ch == "\t" and keep_tabs) or unicodedata.category(ch) not in _UNSAFE_CATEGORIES:
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape", "backslashreplace").decode("ascii"))
    return "".join(out)


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell: neutralised where it is text a spreadsheet would run."""
    if not isinstance(value, str) or not value:
        return value
    if value[0] == "'" or (value[0] in CSV_TRIGGERS and not _PLAIN_NUMBER.fullmatch(value)):
        return "'" + value
    return value


def csv_text(value: Any) -> Any:
    """A cell read back from a CSV cudalab wrote: the quote csv_cell added taken off."""
    return value[1:] if isinstance(value, str) and value.startswith("'") else value


def _text_columns(df: pd.DataFrame) -> list[str]:
    import pandas as pd

    return [c for c in df.columns
            if pd.api.types.is_object_dtype(df[c]) or pd.api.types.is_string_dtype(df[c])]


def csv_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of df ready for to_csv: every text cell through csv_cell (numbers untouched),
    and the column names too."""
    out = df.copy()
    for c in _text_columns(out):
        out[c] = out[c].map(csv_cell, na_action="ignore")
    return out.rename(columns=lambda c: csv_cell(c) if isinstance(c, str) else c)


def write_frame(df: pd.DataFrame, path: Any) -> None:
    """df as CSV (no index) through csv_frame. A text cell holding a bare CR would end the
    row for a reader (the csv module quotes only what holds a character of its line end, \n):
    where one does, every text cell is quoted (QUOTE_NONNUMERIC), so no row can be forged."""
    import csv

    out = csv_frame(df)
    # a plain loop: map() keeps a string column's dtype, and an empty one cannot any()
    cr = any(isinstance(v, str) and "\r" in v for c in _text_columns(out) for v in out[c])
    out.to_csv(path, index=False, quoting=csv.QUOTE_NONNUMERIC if cr else csv.QUOTE_MINIMAL)


def uncsv_frame(df: pd.DataFrame, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """df read back from a CSV written through csv_frame: its text cells as they were."""
    cols = _text_columns(df) if columns is None else [c for c in columns if c in df]
    for c in cols:
        df[c] = df[c].map(csv_text, na_action="ignore").astype(df[c].dtype)
    return df.rename(columns=lambda c: csv_text(c) if isinstance(c, str) else c)


def csv_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row for csv.DictWriter with every text cell through csv_cell."""
    return {k: csv_cell(v) for k, v in row.items()}
