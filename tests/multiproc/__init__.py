"""Multi-process tier: real gloo process groups from a pool of ranks (see conftest.py)."""
