"""The wgmma diagnostics' own logic off the GPU (tools/wgmma_diag.py): the swizzle image the
TMA dump is checked against, and what the coded and random checks say about a kernel whose
output is right or wrong in a known way. The kernel is stood in for by numpy: the
diagnostics exist to judge kernels on a GPU, which this machine does not have."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from cudalab.experiments.tensor_cores import numerics

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def diag(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    return importlib.import_module("wgmma_diag")


def _kernel(bug: str):
    """A stand-in for one launch of a rung: the exact product, then the named mistake."""
    def run_rung(cuda, cp, mod, build, rung, prec, dev_a, dev_b, m, k, n):
        p = "fp16" if prec == "fp16_bt" else prec
        a, b = numerics.exact_values(dev_a, p), numerics.exact_values(dev_b, p)
        if bug == "k+8":  # B's k-rows read 8 further on
            b = np.roll(b, -8, axis=0)
        c = a @ b
        if bug == "cols":  # neighbouring 8-column groups exchanged in the epilogue
            c = c.reshape(m, n // 16, 2, 8)[:, :, ::-1, :].reshape(m, n)
        if bug == "rows":  # the second warpgroup's rows never written
            c[64:128] = np.nan
        return c.astype(np.float32)
    return run_rung


def test_the_swizzle_image_moves_16_byte_chunks_by_the_row(diag):
    rows = np.arange(16 * 128, dtype=np.uint32).astype(np.uint8).reshape(16, 128)
    img = diag.swizzle128(rows)
    assert (img[0] == rows[0]).all()
    assert (img[1, 16:32] == rows[1, 0:16]).all() and (img[3, 0:16] == rows[3, 48:64]).all()
    assert (img[9, 16:32] == rows[9, 0:16]).all()  # the pattern repeats every 8 rows
    assert diag.compare_region("A", img, rows, 2)
    assert not diag.compare_region("A", rows, rows, 2)


@pytest.mark.parametrize("prec", ["fp16", "tf32", "fp16_bt"])
def test_a_right_kernel_passes_every_check(diag, monkeypatch, prec, capsys):
    monkeypatch.setattr(diag, "run_rung", _kernel("none"))
    assert diag.coded_probe(None, None, None, "s4", "wgmma_ws", prec, "A")
    assert diag.coded_probe(None, None, None, "s4", "wgmma_ws", prec, "B")
    assert diag.random_check(None, None, None, "s4", "wgmma_ws", prec, 256, 256, 256)
    assert "100.0% exact" in capsys.readouterr().out


@pytest.mark.parametrize(("bug", "which", "says"), [
    ("k+8", "A", "k got-want +8:100%; n%32 got-want +0:100%"),
    ("k+8", "B", "k got-want -8:100%"),
    ("cols", "A", "k got-want +0:100%; n%32 got-want -8:50% +8:50%"),
    ("rows", "B", "50.0% exact"),
])
def test_the_coded_checks_say_which_element_went_where(diag, monkeypatch, capsys, bug, which,
                                                        says):
    monkeypatch.setattr(diag, "run_rung", _kernel(bug))
    assert not diag.coded_probe(None, None, None, "s4", "wgmma_tma", "fp16", which)
    out = capsys.readouterr().out
    assert says in out
    if bug == "rows":  # 16 x 16 blocks: rows 64..127 unwritten, the others right
        assert "16x16 blocks, rows down: " + " ".join(["." * 16] * 4 + ["n" * 16] * 4) in out


def test_a_wrong_random_product_is_mapped_and_named(diag, monkeypatch, capsys):
    monkeypatch.setattr(diag, "run_rung", _kernel("rows"))
    assert not diag.random_check(None, None, None, "s4", "wgmma_pipe", "bf16", 256, 256, 256)
    out = capsys.readouterr().out
    assert "WRONG" in out and "NaN 25.0%" in out
