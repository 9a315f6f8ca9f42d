"""evals.gpu_queue, the runner of the GPU machine's eval jobs, with shell commands for jobs (no
GPU, no model): the memory budget, first-come order, the retry alone after an out-of-memory
failure, the statuses it leaves, and a malformed job list refused by line."""

from __future__ import annotations

import pytest

from dcp_a2a.evals import gpu_queue as gq

pytestmark = pytest.mark.unit


def _events(logs):
    """(event, job) pairs of queue.log in order: ('start'|'exit'|'oom', name)."""
    out = []
    for line in (logs / "queue.log").read_text().splitlines()[1:-1]:
        name, what = line.split(" ", 1)[1].split(": ", 1)
        out.append(("start" if what.startswith("started") else
                    "oom" if "out of memory" in what else "exit", name))
    return out


def test_budget_order_and_retry_alone(tmp_path):
    jobs = gq.parse("\n".join([
        "# a comment, then a blank line",
        "",
        "a 40 sleep 0.3",
        "b 40 echo 'torch.OutOfMemoryError: CUDA out of memory'; exit 1",
        "c 50 echo fine",
        "d 4 exit 3",
    ]))
    assert [(j.name, j.gb) for j in jobs] == [("a", 40), ("b", 40), ("c", 50), ("d", 4)]
    assert gq.run(jobs, tmp_path, budget_gb=85, poll_s=0.05) == 1
    ev = _events(tmp_path)
    # a and b fit together (80 of 85); c (50 more) waits for room, and d behind it, though d
    # (4 more) would fit: nothing overtakes the head of the queue
    assert ev[:2] == [("start", "a"), ("start", "b")]
    assert ev.index(("oom", "b")) < ev.index(("start", "c")) < ev.index(("start", "d"))
    # b ran out of memory: it goes first again, alone (nothing beside it, nothing after it)
    second_b = [i for i, e in enumerate(ev) if e == ("start", "b")][1]
    assert all(e[0] != "start" for e in ev[second_b + 1:ev.index(("exit", "b"))])
    assert ev.index(("exit", "a")) < second_b
    assert ev.index(("exit", "b")) < ev.index(("start", "c"))
    rc = {j: (tmp_path / f"{j}.rc").read_text().strip() for j in "abcd"}
    assert rc == {"a": "0", "b": "1", "c": "0", "d": "3"}
    assert (tmp_path / "b.oom").exists() and not (tmp_path / "a.oom").exists()
    assert (tmp_path / "c.log").read_text() == "fine\n"
    assert (tmp_path / "queue.log").read_text().splitlines()[-1].endswith("failed: b, d")


def test_all_passing_is_zero_and_a_job_over_budget_runs_alone(tmp_path):
    jobs = gq.parse("big 999 echo big\nsmall 1 echo small")
    assert gq.run(jobs, tmp_path, budget_gb=10, poll_s=0.05) == 0
    ev = _events(tmp_path)
    assert ev == [("start", "big"), ("exit", "big"), ("start", "small"), ("exit", "small")]


@pytest.mark.parametrize("text, says", [
    ("a 1", "line 1: expected 'NAME GB COMMAND...'"),
    ("\nbad/name 1 true", "line 2: expected"),
    ("a lots true", "line 1: GB must be a number, got 'lots'"),
    ("a -1 true", "line 1: negative GB"),
    ("a 1 true\na 2 true", "line 2: negative GB or a repeated name 'a'"),
])
def test_malformed_job_lists(text, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(".", r"\.")):
        gq.parse(text)


def test_main_refuses_a_bad_file_in_one_line(tmp_path, capsys):
    f = tmp_path / "jobs"
    f.write_text("a x true\n")
    assert gq.main([str(f), "--logs", str(tmp_path / "q"), "--budget-gb", "1"]) == 2
    assert capsys.readouterr().err.strip() == "gpu_queue: line 1: GB must be a number, got 'x'"
    assert not (tmp_path / "q").exists()


def test_the_gpu_evals_script_queues_commands_its_drivers_take(tmp_path):
    """evals/run_gpu_evals.sh --jobs: a job list gpu_queue parses, every job's command one that
    its driver's argument parser takes (a renamed or dropped option fails here, not on a GPU
    node), and an unknown job name refused before anything runs."""
    import shlex
    import subprocess
    from pathlib import Path

    from tests.unit.test_documented_commands import _parse_with_main

    script = Path(__file__).resolve().parents[2] / "evals" / "run_gpu_evals.sh"
    listed = subprocess.run(["bash", str(script), "--jobs", str(tmp_path)], capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    jobs = gq.parse(listed.stdout)
    assert [j.name for j in jobs] == ["bf16-reference", "bf16-packed", "fp32-reference",
                                      "fp32-packed", "bf16-two_collective", "bf16-ag_rs",
                                      "parity", "torchrun"]
    for job in jobs:
        argv = shlex.split(job.command)
        module = argv[argv.index("-m") + 1]
        ns = _parse_with_main(module, argv[argv.index("-m") + 2:])
        assert Path(ns.out) == tmp_path / job.name
    bad = subprocess.run(["bash", str(script), str(tmp_path / "o"), "nonesuch"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown job nonesuch" in bad.stderr
    assert not (tmp_path / "o").exists()
