"""The direct launch's bookkeeping (dcp_a2a.kernels.launch) on a stand-in kernel, no GPU: the
launcher gets the arguments in the kernel's order as ``JITFunction.run`` passes them (launch
options left out, defaults filled in), on the current device's stream; whatever decides
Triton's specialisation is part of the key; anything it cannot order goes through Triton."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from dcp_a2a.kernels import launch as direct

pytestmark = pytest.mark.unit


class _Compiled:
    function, packed_metadata = "function", "metadata"

    def __init__(self):
        self.runs = []

    def launch_metadata(self, grid, stream, *args):
        return ("meta", grid, stream)

    def run(self, *args):
        self.runs.append(args)


class _Kernel:
    pre_run_hooks: list = []

    def __init__(self, fn):
        self.fn, self.dispatched, self.compiled = fn, [], []

    def __getitem__(self, grid):
        def dispatch(*args, **kw):
            self.dispatched.append((grid, args, kw))
            self.compiled.append(_Compiled())
            return self.compiled[-1]
        return dispatch


def _fn(x_ptr, n, stride, BLOCK=4, FLAG=False, MODE=1):
    pass


@pytest.fixture
def runtime(monkeypatch):
    """A driver whose current device and stream the test sets, and knobs with hooks."""
    state = SimpleNamespace(device=0, streams={0: 111, 1: 222})
    driver = SimpleNamespace(get_current_device=lambda: state.device,
                             get_current_stream=lambda d: state.streams[d])
    knobs = SimpleNamespace(runtime=SimpleNamespace(launch_enter_hook="enter",
                                                    launch_exit_hook="exit"))
    monkeypatch.setattr(direct, "_runtime", lambda: (driver, knobs))
    monkeypatch.setattr(direct, "direct_enabled", lambda: True)
    return state


def test_the_launcher_gets_the_kernels_order_options_left_out(runtime):
    k = _Kernel(_fn)
    launches = direct.Launches(k)
    x = torch.zeros(8)
    first = launches((3, 2), x, 5, 16, BLOCK=8, MODE=2, num_warps=4, enable_fp_fusion=False)
    assert len(k.dispatched) == 1 and first is k.compiled[0] and launches.direct == 0
    again = launches((3, 2), x, 5, 16, BLOCK=8, MODE=2, num_warps=4, enable_fp_fusion=False)
    assert again is first and len(k.dispatched) == 1 and launches.direct == 1
    (args,) = first.runs
    # grid padded to three dims, the stream, the compiled function and metadata, what
    # launch_metadata gave, the hooks; then the parameters in order, FLAG's default filled in
    assert args[:9] == (3, 2, 1, 111, "function", "metadata", ("meta", (3, 2), 111), "enter",
                        "exit")
    assert args[9] is x and args[10:] == (5, 16, 8, False, 2)
    runtime.device = 1  # the current device's stream, and a key of its own
    launches((3, 2), x, 5, 16, BLOCK=8, MODE=2, num_warps=4, enable_fp_fusion=False)
    assert len(k.dispatched) == 2


@pytest.mark.parametrize("change", ["int", "dtype", "alignment", "constexpr", "option"])
def test_what_triton_specialises_on_is_part_of_the_key(runtime, change):
    k = _Kernel(_fn)
    launches = direct.Launches(k)
    buf = torch.zeros(64)
    base = dict(x=buf[:8], n=5, kw=dict(BLOCK=8, num_warps=4))
    launches((1,), base["x"], base["n"], 16, **base["kw"])
    other = dict(base)
    if change == "int":
        other["n"] = 6
    elif change == "dtype":
        other["x"] = torch.zeros(8, dtype=torch.float64)
    elif change == "alignment":
        other["x"] = buf[1:9]  # 4 bytes further: not 16-byte aligned
    elif change == "constexpr":
        other["kw"] = dict(BLOCK=16, num_warps=4)
    else:
        other["kw"] = dict(BLOCK=8, num_warps=8)
    launches((1,), other["x"], other["n"], 16, **other["kw"])
    assert len(k.dispatched) == 2 and launches.direct == 0
    launches((1,), buf[4:12], base["n"], 16, **base["kw"])  # 16 bytes on: the same key
    assert len(k.dispatched) == 2 and launches.direct == 1


def test_what_it_cannot_order_goes_through_triton(runtime):
    def needs_keyword(x_ptr, n, BLOCK):  # BLOCK neither given nor defaulted
        pass
    k = _Kernel(needs_keyword)
    launches = direct.Launches(k)
    for _ in range(2):
        launches((1,), torch.zeros(4), 3)
    assert len(k.dispatched) == 2 and not launches.usable and launches.direct == 0


def test_stand_ins_hooks_and_the_switch_go_through_triton(runtime, monkeypatch):
    stand_in = _Kernel(None)  # no function: what a test puts in a kernel's place
    direct.Launches(stand_in)((1,), torch.zeros(4), 3, 16)
    direct.Launches(stand_in)((1,), torch.zeros(4), 3, 16)
    assert len(stand_in.dispatched) == 2
    direct.launch(stand_in, (1,), torch.zeros(4), 3, 16)  # called as it is, not kept
    assert len(stand_in.dispatched) == 3 and stand_in not in direct._ALL
    hooked = _Kernel(_fn)
    hooked.pre_run_hooks = [print]
    launches = direct.Launches(hooked)
    for _ in range(2):
        launches((1,), torch.zeros(4), 3, 16)
    assert len(hooked.dispatched) == 2 and launches.direct == 0
    monkeypatch.undo()  # the real switch: the interpreter here, or DCP_A2A_TRITON_DISPATCH=1
    monkeypatch.setenv(direct.DISPATCH_ENV, "1")
    monkeypatch.setattr(direct._env, "INTERPRET", False)
    assert not direct.direct_enabled()


def _site_kernel(x_ptr, y_ptr, n, BLOCK=4):
    pass


def test_a_site_repeats_the_launch_with_integer_addresses(runtime, monkeypatch):
    """bind launches like launch() and returns a Site; the Site passes the new addresses as
    integers with every other argument as first given, on the current stream, and refuses
    (False, nothing launched) where the launch must go through Triton: another current
    device, a launch hook, a stand-in under the kernel's name, launches switched off."""
    k = _Kernel(_site_kernel)
    monkeypatch.setattr(sys.modules[__name__], "_site_kernel", k)
    monkeypatch.setattr(direct, "_ALL", {})
    x, y = torch.zeros(8), torch.zeros(8)
    site = direct.bind(k, (3,), x, y, 5, BLOCK=8, num_warps=2)
    assert site is not None and len(k.dispatched) == 1
    compiled, launches = k.compiled[0], direct._ALL[k]
    hooks = launches.runtime[1].runtime
    assert site(0, 0) is False  # the fixture's knobs have hooks set
    hooks.launch_enter_hook = SimpleNamespace(calls=[print])  # a chain with a hook in it
    hooks.launch_exit_hook = None
    assert site(0, 0) is False
    hooks.launch_enter_hook = SimpleNamespace(calls=[])  # Triton's default: an empty chain
    assert site(1024, 2048) is True
    assert compiled.runs[-1] == (3, 1, 1, 111, "function", "metadata", None, None, None,
                                 1024, 2048, 5, 8)
    assert launches.direct == launches.sited == 1 and len(k.dispatched) == 1
    runtime.device = 1
    assert site(0, 0) is False
    runtime.device = 0
    monkeypatch.setattr(sys.modules[__name__], "_site_kernel", _Kernel(_site_kernel))
    assert site(0, 0) is False
    monkeypatch.setattr(sys.modules[__name__], "_site_kernel", k)
    launches.usable = False
    assert site(0, 0) is False
    assert len(compiled.runs) == 1 and launches.direct == launches.sited == 1


def test_no_site_where_tensors_do_not_lead(runtime, monkeypatch):
    def late(n, x_ptr):
        pass
    k = _Kernel(late)
    monkeypatch.setattr(direct, "_ALL", {})
    assert direct.bind(k, (1,), 3, torch.zeros(4)) is None
    assert len(k.dispatched) == 1  # still launched


def test_no_launch_metadata_without_an_active_hook(runtime):
    """Triton's knobs hold empty hook chains by default: then the launcher gets no hooks and
    no launch metadata (building it is host time a call), as Triton's launcher would call
    nothing."""
    k = _Kernel(_fn)
    launches = direct.Launches(k)
    x = torch.zeros(8)
    launches((2,), x, 5, 16)
    hooks = launches.runtime[1].runtime
    hooks.launch_enter_hook = SimpleNamespace(calls=[])
    hooks.launch_exit_hook = None
    launches((2,), x, 5, 16)
    assert k.compiled[0].runs[-1][6:9] == (None, None, None)
