"""Where a rank computes and over which process-group backend: NCCL when every local rank can
have a GPU of its own, gloo otherwise (ranks sharing the GPUs, or on the CPU through Triton's
interpreter); and how much memory it has there. The pool of ranks, the accuracy job and the
collective benchmark choose alike."""

from __future__ import annotations

import os


def gpu_count() -> int:
    """CUDA devices visible here, counted without initialising CUDA in this process (NVML),
    so that processes forked from it can still use CUDA."""
    import torch

    return torch.cuda.device_count()  # NVML first: no CUDA context is created here


def auto_backend() -> str:
    """For a rank started by torchrun: nccl when every local rank can have a GPU of its own,
    else gloo (ranks share the GPUs, or run on the CPU)."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    gpus = gpu_count()
    return "nccl" if gpus and gpus >= local_world else "gloo"


def rank_device(backend: str, local_rank: int, device: str | None = None):
    """The device a rank of a ``backend`` group computes on: ``cuda:local_rank`` for nccl (a GPU
    per rank); for gloo ``cuda:(local_rank % GPUs)`` where there are GPUs (ranks may share one;
    gloo moves CUDA tensors through host memory), else the CPU. ``device`` ("cpu"/"cuda")
    overrides the choice; a CPU rank needs Triton's interpreter."""
    import torch

    gpus = gpu_count()
    want = device or ("cuda" if backend == "nccl" or gpus else "cpu")
    if want == "cpu":
        if backend == "nccl":
            raise ValueError("an nccl group computes on GPUs; use --dist-backend gloo for CPU "
                             "ranks")
        return torch.device("cpu")
    if gpus == 0:
        raise ValueError("no CUDA GPU visible for a CUDA rank")
    if backend == "nccl" and local_rank >= gpus:
        raise ValueError(f"an nccl group needs a GPU per rank: local rank {local_rank}, "
                         f"{gpus} GPU(s); use --dist-backend gloo to share GPUs")
    return torch.device("cuda", local_rank % gpus)


def device_memory(device, ranks_here: int = 1) -> tuple[int, str]:
    """(bytes one rank may use on ``device``, shared by ``ranks_here`` ranks; what it is, in
    words): the card's memory, or the machine's, split evenly. A job checks its largest case
    against it before it starts, so that a size that cannot fit is refused in a line rather than
    by an allocator's traceback after hours of work."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        where = f"{torch.cuda.get_device_name(device)}'s {total / 2**30:.0f} GiB"
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        where = f"this machine's {total / 2**30:.0f} GiB of memory"
    share = total // max(1, ranks_here)
    if ranks_here > 1:
        where += f" shared by {ranks_here} ranks"
    return share, where
