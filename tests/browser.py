"""Debian's chromium driven by playwright, for the tests that open a page: skipped where
either is missing, failed instead where CUDALAB_REQUIRE_BROWSER is set (CI)."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest


def chromium() -> tuple[str, Any]:
    """(chromium's path, playwright's sync_playwright)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if exe and sync_playwright:
        return exe, sync_playwright
    why = "needs Debian's chromium and the playwright package"
    if os.environ.get("CUDALAB_REQUIRE_BROWSER"):
        pytest.fail(why + " (CUDALAB_REQUIRE_BROWSER is set)")
    pytest.skip(why)
