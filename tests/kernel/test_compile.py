"""torch.compile(fullgraph=True) through the public ops (dcp_a2a.custom_ops): an attention
combine module (pack -> exchange -> combine, into=, lse_reduce with and without the
up-projection) compiles without a graph break and gives eager's bits (aot_eager on the CPU,
whose kernels run in Triton's interpreter; inductor on CUDA, with a CUDA-graph capture of the
compiled module replayed on new inputs); a compiled lse_reduce holds torch's functional
all_to_all_single; backends without a traced form run eagerly (a graph break, named under
fullgraph)."""

from __future__ import annotations

import pytest
import torch

import dcp_a2a
from dcp_a2a import Group
from dcp_a2a.testing.data import bits_view, partials

pytestmark = pytest.mark.kernel

N, B, H, D, V = 2, 3, 4, 16, 8


class AttentionCombine(torch.nn.Module):
    """N ranks' partials in one process: each packs, the exchange is a transpose of the send
    buffers, each combines (rank 0 into a caller's buffer); then a group of one's lse_reduce,
    plain and up-projected in both orders."""

    def __init__(self, w):
        super().__init__()
        self.w = w

    def forward(self, outs, lses, into):
        p = dcp_a2a.lse_pack_dim(outs.dtype)
        sends = []
        for r in range(N):
            send = outs.new_empty((N, B, H // N, D + p))
            dcp_a2a.pack_send(outs[r], lses[r], send, N, H // N, D, p)
            sends.append(send)
        recvs = torch.stack(sends).transpose(0, 1)  # recv[r][src] = send_src[r]
        first, first_lse = dcp_a2a.unpack_combine(recvs[0].contiguous(), D, p, True, True,
                                                  into=into)
        second = dcp_a2a.unpack_combine(recvs[1].contiguous(), D, p, False, False)
        one = Group(1, 0, None)
        alone, alone_lse = dcp_a2a.lse_reduce(outs[0], lses[0], one, return_lse=True)
        before = dcp_a2a.lse_reduce(outs[1], lses[1], one, w_uv=self.w, up_proj="before_exchange")
        after = dcp_a2a.lse_reduce(outs[1], lses[1], one, w_uv=self.w, up_proj="after_merge")
        return first, first_lse, second, alone, alone_lse, before, after


def _inputs(device, seed=0):
    outs, lses = partials(N, B, H, D, torch.bfloat16, seed=seed, device=device)
    return outs, lses, torch.empty(B, H // N, D, dtype=torch.bfloat16, device=device)


def _same(got, want):
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(bits_view(g.contiguous()), bits_view(w.contiguous())), f"result {i}"


def test_compiled_combine_module_gives_eager_bits(device):
    w = (torch.randn(H, D, V, generator=torch.Generator().manual_seed(1)) / 4).to(
        torch.bfloat16).to(device)
    m = AttentionCombine(w)
    outs, lses, into = _inputs(device)
    want = m(outs, lses, into.clone())
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    compiled = torch.compile(m, fullgraph=True, backend=backend)
    got_into = torch.empty_like(into)
    got = compiled(outs, lses, got_into)
    _same(got, want)
    _same([got_into], [want[0]])  # the caller's buffer holds the result
    outs2, lses2, _ = _inputs(device, seed=5)  # the same graph on other inputs
    _same(compiled(outs2, lses2, got_into), m(outs2, lses2, into.clone()))


@pytest.mark.gpu
def test_cuda_graph_of_the_compiled_module_replays_bitwise():
    """Capture the inductor-compiled module in a CUDA graph; replay it on new inputs copied into
    the captured ones: eager's bits on those inputs, in the caller's buffer too."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    w = (torch.randn(H, D, V, generator=torch.Generator().manual_seed(1)) / 4).to(
        torch.bfloat16).cuda()
    m = AttentionCombine(w)
    compiled = torch.compile(m, fullgraph=True, backend="inductor")
    outs, lses, into = _inputs("cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            compiled(outs, lses, into)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static = compiled(outs, lses, into)
    for seed in (11, 12):
        new_outs, new_lses, _ = _inputs("cuda", seed=seed)
        outs.copy_(new_outs)
        lses.copy_(new_lses)
        g.replay()
        torch.cuda.synchronize()
        want = m(new_outs, new_lses, torch.empty_like(into))
        _same(static, want)
        _same([into], [want[0]])


@pytest.fixture
def fake_group_of_two():
    """torch's fake process group (collectives that move nothing), registered as the default
    group of 2 ranks for the length of a test: enough to trace the functional collective."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield Group.from_process_group()
    finally:
        dist.destroy_process_group()


def test_compiled_lse_reduce_holds_the_functional_all_to_all(fake_group_of_two, device):
    group = fake_group_of_two
    outs, lses = partials(1, B, H, D, torch.bfloat16, device=device)
    w = torch.randn(H, D, V).to(torch.bfloat16).to(device)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    def f(out, lse):
        return (dcp_a2a.lse_reduce(out, lse, group, return_lse=True),
                dcp_a2a.lse_reduce(out, lse, group, w_uv=w, up_proj="before_exchange"),
                dcp_a2a.lse_reduce(out, lse, group, w_uv=w, up_proj="after_merge"))

    torch.compile(f, fullgraph=True, backend=capture)(outs[0], lses[0])
    (ops,) = graphs
    mine = [op.removesuffix(".default").rsplit(".", 1)[-1] for op in ops
            if "dcp_a2a" in op or "all_to_all" in op]
    exchange = ["pack_send", "all_to_all_single", "unpack_combine"]
    assert mine == exchange + ["project"] + exchange + exchange + ["project"], mine


def test_backends_without_a_traced_form_run_eagerly(device):
    """ag_rs under torch.compile: eager's result (a graph break); under fullgraph=True an error
    naming the eager call."""
    outs, lses = partials(1, B, H, D, torch.float32, device=device)

    def f(out, lse):
        return dcp_a2a.lse_reduce(out, lse, Group(1, 0, None), backend="ag_rs", return_lse=True)

    want = f(outs[0], lses[0])
    got = torch.compile(f, backend="eager")(outs[0], lses[0])
    _same(got, want)

    def g(out, lse):
        return dcp_a2a.lse_reduce(out, lse, Group(1, 0, None), backend="two_collective")

    with pytest.raises(Exception, match="_lse_reduce_eagerly"):
        torch.compile(g, fullgraph=True, backend="eager")(outs[0], lses[0])
