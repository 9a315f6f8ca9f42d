"""The project's test suite: the fixtures come from the suite's pytest plugin
(dcp_a2a/testing/plugin.py, loaded by pyproject.toml's addopts), which the shipped conformance
suite uses too."""

import os
import sys

import pytest

# The suite starts about a hundred Python processes (pools of ranks, torchrun launches, the
# self-check's pytest sessions). Where the environment forbids writing byte code (container
# images often set PYTHONDONTWRITEBYTECODE=1) and the install skipped it (the README's
# `pip install --no-compile`), each of them would compile torch's and transformers' modules
# from source again: on the 2-core CI machine 6m19s of tests instead of 4m18s. Here they may
# cache what they compile (what pip would have written at install time anyway).
if os.environ.get("PYTHONDONTWRITEBYTECODE"):
    os.environ["PYTHONDONTWRITEBYTECODE"] = ""
    sys.dont_write_bytecode = False


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Longest first: the self-check (a minute and more), then the tests marked ``slow``, then
    the rest in the plugin's order. xdist workers take tests in this order, and a long test
    handed out last keeps one core busy after the others have finished (on the 2-core CI
    machine that was 90 s of a 5-minute run)."""
    def cost(item):
        if item.get_closest_marker("selfcheck"):
            return 0
        return 1 if item.get_closest_marker("slow") else 2
    items.sort(key=cost)
