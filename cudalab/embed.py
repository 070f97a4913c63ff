"""A figure file as a data: URI, so the HTML report carries its figures and needs no files
beside it. Its own module because the report and the sections it renders (telemetry) both
embed figures, and a section must not import the report that renders it."""

from __future__ import annotations

import base64
from pathlib import Path

MIME = {"png": "image/png", "svg": "image/svg+xml"}


def data_uri(path: Path) -> str:
    mime = MIME[path.suffix[1:]]
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()
