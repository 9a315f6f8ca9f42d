"""The merge check's first line says which quantity failed (dcp_a2a.testing.compare): the
summaries group failures by that line, so an implementation whose merged LSE alone is wrong
(SGLang's combine writes it at the input LSE's strides: 71 of its 121 merge-bound defects on
one H100, the output right in each) shows one cause, not one per test."""

from __future__ import annotations

import pytest
import torch

from dcp_a2a.reference.combine import lse_weighted_combine
from dcp_a2a.testing.compare import check_merge
from dcp_a2a.testing.data import partials

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("spoil,headline", [
    ((), "merge check (a2a, float32, N=4, base e)"),
    (("lse",), "merge check (a2a, float32, N=4, base e): the LSE over its bound, the output "
               "within"),
    (("out",), "merge check (a2a, float32, N=4, base e): the output over its bound"),
    (("out", "lse"), "merge check (a2a, float32, N=4, base e): the output and the LSE over "
                     "their bounds"),
], ids=["right", "lse", "output", "both"])
def test_the_first_line_names_what_is_over_its_bound(spoil, headline):
    outs, lses = partials(4, 3, 2, 8, torch.float32, seed=3)
    out, lse = lse_weighted_combine(outs, lses, True, True)
    out, lse = out.to(torch.float32), lse.to(torch.float32)
    if "out" in spoil:
        out = out + 1.0
    if "lse" in spoil:
        lse = lse - 5.0
    rep = check_merge(out, lse, outs, lses)
    assert rep.ok == (not spoil)
    assert rep.describe().splitlines()[0] == headline
