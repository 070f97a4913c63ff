"""The manual says what the code does: docs/config.md's key list is the schemas'."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_key_list_is_the_schemas():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "config_docs.py"), "--check"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
