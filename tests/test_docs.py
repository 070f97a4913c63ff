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


def test_a_lesson_not_yet_listed_is_named_and_a_listed_block_must_match(tmp_path):
    """A lesson just added (one folder, one config line) passes the check with a note; a
    listed block that no longer says what its schema says fails it."""
    doc = (ROOT / "docs" / "config.md").read_text()
    start = doc.index("### `experiments.sobel:`")
    end = doc.index("\n### ", start + 1)
    check = [sys.executable, str(ROOT / "tools" / "config_docs.py"), "--check", "--doc"]
    (tmp_path / "without.md").write_text(doc[:start] + doc[end + 1:])
    r = subprocess.run([*check, str(tmp_path / "without.md")], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0 and "does not list the block of sobel yet" in r.stderr, r.stderr
    (tmp_path / "stale.md").write_text(doc.replace("### `experiments.sobel:`\n",
                                                   "### `experiments.sobel:`\n\nstale\n", 1))
    r = subprocess.run([*check, str(tmp_path / "stale.md")], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 1 and "is not what the schemas say" in r.stderr, r.stderr


def _layout_block() -> str:
    text = (ROOT / "docs" / "layout.md").read_text()
    return text.split("```\n", 2)[1]


def test_the_layout_is_a_true_map():
    """docs/layout.md names every module of the package (by its path, or beside others as
    `a.py, b.py`), every tool and workflow folder, and names no path that does not exist."""
    import re

    block = _layout_block()
    named = set(re.findall(r"[\w./<>*-]+\.(?:py|smk|sh|yaml|cu)\b|[\w.-]+/", block))
    modules = sorted(p for p in (ROOT / "cudalab").glob("*.py") if p.name != "__init__.py")
    missing = [p.name for p in modules if f"cudalab/{p.name}" not in block
               and not re.search(rf"(?:, |\s|\(){re.escape(p.name)}\b", block)]
    assert not missing, f"modules docs/layout.md does not name: {missing}"
    tools = sorted(p.name for p in (ROOT / "tools").iterdir() if p.is_file())
    assert not [t for t in tools if t not in block and t.rsplit(".", 1)[0] not in block], tools
    gone = [n for n in named if n.startswith(("cudalab/", "tools/", "scripts/", "cuda/",
                                              "workflow/", "reports/", "tests/"))
            and "<" not in n and "*" not in n and not (ROOT / n).exists()]
    assert not gone, f"docs/layout.md names paths that do not exist: {gone}"


def test_every_lesson_folder_is_on_the_map_as_one_lesson():
    block = _layout_block()
    assert "cudalab/experiments/<name>/" in block and "cuda/<name>/*.cu" in block
