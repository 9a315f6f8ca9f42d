"""Buffer lifetimes under CUDA graphs and streams, for ANY implementation of the contract: the
bug classes that reached engines after the packed all-to-all shipped.

    capture_grow_replay      capture lse_reduce at a small B; an eager call at a much larger B
                             (any buffer the implementation owns may grow); memory it freed is
                             taken back by other tensors; replay: bytes right, nothing else hit
                             (an address baked into a graph, freed to the eager allocator and
                             taken by live tensors)
    pool_shuffled_replays    graphs of several B captured from one shared pool, replayed in a
                             shuffled order with eager calls in between, each graph's output
                             read right after its own replay (PyTorch's rule for a shared
                             pool); two results held at once: a graph's output survives the
                             replay of a graph captured after it, and eager results survive
                             every replay (a buffer the implementation keeps and hands out
                             again while a result that lives in it is still held)
    results_held             eager calls of two batch sizes whose results are all held, then
                             checked together: each result is the caller's (CPU too)
    staging_next_to_inputs   the partials carved from one workspace as engines carve them (out,
                             then lse, then other live data), also right after a previous call's
                             results were freed: inputs and neighbours untouched, results right
                             (CPU too)
    streams_and_delay        calls on two CUDA streams queued behind one gate, so they run at
                             once; then one rank delayed by a spin kernel before its call:
                             results right

PyTorch's rule for graphs that share a memory pool: memory a capture frees goes back to the pool
and a graph captured later may place its own tensors there, so replaying an earlier graph may
rewrite a later graph's output. Safe in any replay order as long as the graphs never run
concurrently and each graph's output is consumed after its own replay, before another graph of
the pool replays -- how engines use one graph per batch size. An implementation may therefore
allocate its temporaries per call (vLLM's packed path does); the scenarios above never read
what that rule does not promise, and fail the real bug classes: an address baked into a graph
that is freed to the eager allocator and taken by live tensors, or a buffer the implementation
keeps and hands out again (staging, a workspace, a returned output) while a graph that uses it
can still replay or a result that lives in it is still held.

Each scenario runs on one rank of a group -- a group of one, N ranks of a real NCCL group, or
one simulated rank of :class:`dcp_a2a.testing.mirror.MirrorGroup` (N ranks holding the same
partials, every collective a device copy: the staging paths of N >= 2 on one GPU or the CPU,
``mirror=True``) -- makes every rank's partials from seeds (so each rank can build the float64
oracle of its heads), and returns a list of failures, each naming the scenario, the step and
the worst wrong element. Nothing here imports pytest: NCCL ranks run these functions.
"""

from __future__ import annotations

import random

import torch

from .compare import check_merge
from .data import heads_of

SCENARIOS = ("capture_grow_replay", "pool_shuffled_replays", "results_held",
             "staging_next_to_inputs", "streams_and_delay")
CUDA_ONLY = ("capture_grow_replay", "pool_shuffled_replays", "streams_and_delay")
ANY_DEVICE = ("results_held", "staging_next_to_inputs")
MIRROR_SIZES = (2, 4, 8)  # simulated group sizes of the one-GPU (and CPU) runs
H, D = 8, 96            # heads (any N in {1, 2, 4, 8} divides them) and a head dim of 96
DTYPE = torch.bfloat16
STREAM_ROWS = 2048        # rows of each call of streams_and_delay
GATE_SPIN_CYCLES = 20_000_000  # ~10 ms: long enough to queue both calls behind the gate


# The envelope of the implementation a scenario runs (set by ``run``): its head dim and LSE base
# (a scenario is about buffers, not about the head dims or bases an engine refuses).
_envelope = None


def _head_dim() -> int:
    return D if _envelope is None else _envelope.fit_head_dim(D)


def _base_e() -> bool:
    return True if _envelope is None else _envelope.base_e


def partials(n: int, b: int, seed: int, device, dtype=DTYPE, mirror: bool = False):
    """Every rank's (out[N, B, H, D], lse[N, B, H] float32) for a step, on ``device``. With
    ``mirror`` the N partials are equal (what a MirrorGroup's ranks hold)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    k = 1 if mirror else n
    outs = torch.randn(k, b, H, _head_dim(), generator=g).to(dtype)
    lses = torch.randn(1, b, H, generator=g) * 8.0 + torch.randn(k, b, H, generator=g) * 4.0
    if mirror:
        outs, lses = outs.expand(n, -1, -1, -1).clone(), lses.expand(n, -1, -1).clone()
    return outs.to(device), lses.to(device)


class Checker:
    """Checks one rank's results against the oracle of every rank's partials; collects
    failures."""

    def __init__(self, scenario: str, rank: int, n: int):
        self.scenario, self.rank, self.n = scenario, rank, n
        self.failures: list[str] = []

    def result(self, step: str, res, outs, lses) -> None:
        out, lse = res if isinstance(res, tuple) else (res, None)
        rep = check_merge(out, lse, outs, lses, heads=heads_of(self.rank, self.n, H),
                          keep_ulp_errors=False, is_lse_base_on_e=_base_e())
        if not rep.ok:
            q = rep.output if not rep.output.ok else rep.lse
            self.failures.append(
                f"{self.scenario}, rank {self.rank}, {step}: {q.quantity} wrong in "
                f"{q.failures} of {q.elements} elements; worst at {q.worst_index}: got "
                f"{q.worst_actual!r}, expected {q.worst_expected!r}")

    def untouched(self, step: str, what: str, now: torch.Tensor, before: torch.Tensor) -> None:
        a, b = _bits(now), _bits(before)
        if not torch.equal(a, b):
            idx = int((a != b).flatten().nonzero()[0])
            self.failures.append(f"{self.scenario}, rank {self.rank}, {step}: {what} was "
                                 f"overwritten (first changed element at flat index {idx})")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _call(impl, group, out, lse):
    return impl.lse_reduce(out, lse, group, return_lse=True, is_lse_base_on_e=_base_e())


_TICKS: list = []  # see _capture


def _capture(fn, pool=None):
    fn()  # warm up outside the capture (compiles, communicator set-up)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    # one node of the scenario's own: an implementation that passes a group of one straight
    # through (as engines do) captures nothing, and torch only warns about an empty graph.
    # The tick is kept for good: a replay writes it, so its memory must never be reused.
    tick = torch.zeros(1, device=torch.cuda.current_device())
    _TICKS.append(tick)
    with torch.cuda.graph(g, pool=pool):
        res = fn()
        tick.add_(1)
    return g, res


def capture_grow_replay(impl, group, rank: int, n: int, device, mirror: bool = False
                        ) -> list[str]:
    chk = Checker("capture_grow_replay", rank, n)
    outs, lses = partials(n, 4, 1, device, mirror=mirror)
    out, lse = outs[rank].clone(), lses[rank].clone()
    g, res = _capture(lambda: _call(impl, group, out, lse))
    big_o, big_l = partials(n, 4096, 2, device, mirror=mirror)
    chk.result("eager call at B=4096 after the capture", _call(impl, group, big_o[rank],
                                                               big_l[rank]), big_o, big_l)
    del big_o, big_l
    torch.cuda.synchronize()
    # take freed memory back: blocks of every size up to the big call's staging, filled with a
    # sentinel; a replay that writes where the implementation's buffers were hits them
    fillers = [torch.full((1 << k,), 0x5A, dtype=torch.uint8, device=device)
               for k in range(10, 24) for _ in range(3)]
    for step in range(3):
        fresh_o, fresh_l = partials(n, 4, 10 + step, device, mirror=mirror)
        out.copy_(fresh_o[rank])
        lse.copy_(fresh_l[rank])
        g.replay()
        torch.cuda.synchronize()
        chk.result(f"replay {step + 1} after the eager growth", res, fresh_o, fresh_l)
    if not all(bool(torch.all(f == 0x5A)) for f in fillers):
        chk.failures.append(f"capture_grow_replay, rank {rank}: a replay wrote into memory "
                            "freed by the eager call (now other tensors')")
    return chk.failures


POOL_SIZES = (1, 3, 8, 17, 64)  # batch sizes of the graphs sharing one pool, in capture order


def pool_shuffled_replays(impl, group, rank: int, n: int, device, replays: int = 100,
                          mirror: bool = False) -> list[str]:
    chk = Checker("pool_shuffled_replays", rank, n)
    pool = torch.cuda.graph_pool_handle()
    graphs = []
    for b in POOL_SIZES:
        outs, lses = partials(n, b, 100 + b, device, mirror=mirror)
        out, lse = outs[rank].clone(), lses[rank].clone()
        g, res = _capture(lambda o=out, l=lse: _call(impl, group, o, l), pool)
        graphs.append(dict(b=b, graph=g, res=res, inputs=(out, lse), fed=None))

    def replay(k: int, i: int) -> None:
        gr = graphs[k]
        fresh_o, fresh_l = partials(n, gr["b"], 1000 + 7 * i + k, device, mirror=mirror)
        gr["inputs"][0].copy_(fresh_o[rank])
        gr["inputs"][1].copy_(fresh_l[rank])
        gr["fed"] = (fresh_o, fresh_l)
        gr["graph"].replay()
        torch.cuda.synchronize()
        chk.result(f"graph B={gr['b']} right after its replay {i + 1}", gr["res"], *gr["fed"])

    held = []  # eager results: the caller's tensors, never in the pool: right to the end
    order = [k for k in range(len(graphs)) for _ in range(replays // len(graphs))]
    random.Random(0).shuffle(order)  # the same order on every rank: the replays hold collectives
    for i, k in enumerate(order):
        replay(k, i)
        if k + 1 < len(graphs) and i % 3 == 0:
            # two results held at once: a graph captured after graph k never takes memory that
            # is live for graph k's output, so that output must survive its replay
            later = k + 1 + i % (len(graphs) - k - 1)
            replay(later, i)
            chk.result(f"graph B={graphs[k]['b']} held while graph B={graphs[later]['b']} "
                       f"(captured after it) replayed", graphs[k]["res"], *graphs[k]["fed"])
        if i % 25 == 24:  # an eager call in between, at a batch size of its own
            eo, el = partials(n, 33, 5000 + i, device, mirror=mirror)
            res = _call(impl, group, eo[rank], el[rank])
            chk.result(f"eager call after replay {i + 1}", res, eo, el)
            held.append((i, res, eo, el))
    torch.cuda.synchronize()
    for i, res, eo, el in held:
        chk.result(f"eager result of the call after replay {i + 1}, held to the end", res, eo,
                   el)
    # (no early exit on a failure: every rank must issue the same collectives)
    return chk.failures


def results_held(impl, group, rank: int, n: int, device, mirror: bool = False) -> list[str]:
    """(Needs no CUDA: it runs on the CPU too.)"""
    chk = Checker("results_held", rank, n)
    calls = []
    for step, b in enumerate((5, 12, 5)):
        o, lse = partials(n, b, 200 + step, device, mirror=mirror)
        calls.append((step, b, _call(impl, group, o[rank], lse[rank]), o, lse))
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    for step, b, res, o, lse in calls:
        chk.result(f"call {step + 1} (B={b}), held while the {len(calls) - step - 1} later "
                   "call(s) ran", res, o, lse)
    return chk.failures


def staging_next_to_inputs(impl, group, rank: int, n: int, device, mirror: bool = False
                           ) -> list[str]:
    """(Needs no CUDA: it runs on the CPU too.)"""
    chk = Checker("staging_next_to_inputs", rank, n)
    sizes = (16, 64) if torch.device(device).type == "cpu" else (64, 512)
    for step, b in enumerate(sizes):
        # a previous call's results freed right before: the workspace below lands where they
        # (and any buffers the implementation released) were
        po, pl = partials(n, b, 300 + step, device, mirror=mirror)
        prev = _call(impl, group, po[rank], pl[rank])
        del prev, po, pl
        outs, lses = partials(n, b, 400 + step, device, mirror=mirror)
        out_bytes = outs[rank].numel() * outs.element_size()
        lse_bytes = lses[rank].numel() * 4
        tail = 1 << 20
        ws = torch.empty(out_bytes + lse_bytes + tail, dtype=torch.uint8, device=device)
        out = ws[:out_bytes].view(DTYPE).view(b, H, _head_dim())
        lse = ws[out_bytes:out_bytes + lse_bytes].view(torch.float32).view(b, H)
        neighbour = ws[out_bytes + lse_bytes:]
        out.copy_(outs[rank])
        lse.copy_(lses[rank])
        neighbour.fill_(0xA5)
        before = ws.clone()
        res = _call(impl, group, out, lse)
        if ws.is_cuda:
            torch.cuda.synchronize()
        chk.untouched(f"B={b}", "the workspace holding out, lse and their neighbour", ws, before)
        chk.result(f"B={b}, partials carved from one workspace", res, outs, lses)
    return chk.failures


def streams_and_delay(impl, group, rank: int, n: int, device, b: int = STREAM_ROWS,
                      mirror: bool = False) -> list[str]:
    chk = Checker("streams_and_delay", rank, n)
    hold, s1, s2 = (torch.cuda.Stream(device) for _ in range(3))
    for step in range(8):
        a_o, a_l = partials(n, b, 600 + step, device, mirror=mirror)
        b_o, b_l = partials(n, b, 700 + step, device, mirror=mirror)
        torch.cuda.synchronize()
        # Both streams wait on one gate that opens after a spin, so the two calls are queued in
        # full before either runs and then run at once. Without the gate the first call's
        # kernels are done before the second is launched and two streams sharing one staging
        # pair come out right.
        gate = torch.cuda.Event()
        with torch.cuda.stream(hold):
            torch.cuda._sleep(GATE_SPIN_CYCLES)
            gate.record(hold)
        s1.wait_event(gate)
        s2.wait_event(gate)
        with torch.cuda.stream(s1):
            ra = _call(impl, group, a_o[rank], a_l[rank])
        with torch.cuda.stream(s2):
            rb = _call(impl, group, b_o[rank], b_l[rank])
        torch.cuda.synchronize()
        chk.result(f"call {step + 1} on stream 1 (B={b})", ra, a_o, a_l)
        chk.result(f"call {step + 1} on stream 2 (B={b})", rb, b_o, b_l)
    for step in range(4):
        o, lse = partials(n, 256, 800 + step, device, mirror=mirror)
        if rank == step % max(n, 1):
            torch.cuda._sleep(50_000_000)  # ~25 ms of spinning before this rank's call
        chk.result(f"call {step + 1} with rank {step % max(n, 1)} delayed",
                   _call(impl, group, o[rank], lse[rank]), o, lse)
    return chk.failures


def run(scenario: str, impl, group, rank: int, n: int, device, mirror: bool = False
        ) -> list[str]:
    global _envelope
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}: one of {', '.join(SCENARIOS)}")
    _envelope = getattr(impl, "envelope", None)
    return globals()[scenario](impl, group, rank, n, device, mirror=mirror)


def mirror_group(n: int, rank: int | None = None):
    """(group, rank) of simulated rank ``rank`` (default: 1, or 0 for a group of one) of a
    MirrorGroup of ``n``; a plain group of one for ``n == 1``."""
    from ..collective import Group

    if n == 1:
        return Group(1, 0, None), 0
    from .mirror import MirrorGroup

    rank = 1 if rank is None else rank
    return Group(n, rank, MirrorGroup(n, rank)), rank
