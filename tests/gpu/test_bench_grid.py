"""GPU tier: one point of the benchmark's grid (``dcp-a2a bench --grid``),
two tables, two interleaved rounds (up to four where a verdict is undecided): every number it
reports is there and positive, each table has a verdict, and a kernel that two tables share is
timed once."""

from __future__ import annotations

import pytest
import torch

from dcp_a2a.testing import bench, bench_grid

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_grid_point_times_every_table_in_rounds():
    tables = ("table", "pack_sixth_pass")  # different pack rules, the same combine rules
    row = bench_grid.grid_point(4, 16, 2, 128, "bfloat16", 4000.0, tables, rounds=2,
                                settle_rounds=4)
    assert row["rounds"] == 2 and set(row["tables"]) == set(tables)
    for op in ("pack", "unpack"):
        assert row[f"{op}_rounds"] in (2, 4)
        assert all(len(v) == row[f"{op}_rounds"] for v in row[f"{op}_times_us"].values())
        for name in tables:
            got = row["tables"][name]
            lo, hi = got[f"{op}_ratio_ci"]
            assert got[f"{op}_verdict"] in ("met", "undecided", "missed") and 0 < lo <= hi
        assert row[f"{op}_verdict"] == row["tables"]["table"][f"{op}_verdict"]
        assert row[f"{op}_straightforward_us"] > 0 and row[f"{op}_copy_us"] > 0
        assert row[f"{op}_spread"] >= 1 and row[f"{op}_timing"] == "graph"
        assert row[f"{op}_us"] == row["tables"]["table"][f"{op}_us"] > 0
        assert row[f"{op}_ratio"] == row[f"{op}_us"] / row[f"{op}_straightforward_us"]
    assert row["tables"]["table"]["unpack_us"] == row["tables"]["pack_sixth_pass"]["unpack_us"]
    text = bench_grid.grid_table([row])
    assert "medians of 2 interleaved rounds" in text and "worst ratio" in text


def test_time_us_warms_the_graph_up_for_the_time_asked_before_timing_it():
    # A kernel of a known length (torch.cuda._sleep spins for a number of cycles) and a device
    # counter of the calls that ran: the untimed replays before the 15 timed ones must add up
    # to at least the warm-up asked for.
    count = torch.zeros((), dtype=torch.int64, device="cuda")

    def call():
        torch.cuda._sleep(200_000)  # ~0.1 ms at the H200's 1.98 GHz
        count.add_(1)

    us, method = bench.time_us(call, 0, reps_in_graph=2, warmup_ms=20)
    assert method == "graph"
    replays = (int(count) - 3) // 2  # less the three eager calls; two calls a replay
    untimed = replays - 15
    assert untimed * 2 * us / 1e3 >= 20 * 0.9, (untimed, us)
    count.zero_()
    bench.time_us(call, 0, reps_in_graph=2, warmup_ms=0)
    assert int(count) == 3 + 2 * 15  # no warm-up asked: the timed replays only
