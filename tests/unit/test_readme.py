"""The README's runnable example runs and prints what it says (docs that cannot rot)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_fifteen_line_example_runs():
    section = README.read_text().split("## In 15 lines", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    assert len(code.strip().splitlines()) <= 15
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {})
    assert printed.getvalue().strip() == "torch.Size([3, 2, 64]) torch.Size([3, 2])"
