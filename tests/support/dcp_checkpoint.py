"""PyTorch Distributed Checkpoints made by PyTorch itself, for tests/test_convert_dcp.py.

``python -m tests.support.dcp_checkpoint FOLDER [--large]`` starts two gloo processes (a file store
rendezvous, no port), places DTensors on a 1-D device mesh of the two CPU ranks
(``Shard(0)`` float32 and bool, ``Shard(1)`` bfloat16, ``Replicate()``), adds a plain tensor and non-tensor entries, and
saves them with ``torch.distributed.checkpoint.save`` (the default FileSystemWriter).
:func:`full_state` is what the test expects back: the same values, whole, made in one process.

``python -m tests.support.dcp_checkpoint load FOLDER SPEC OUT`` is the other way (for
tests/test_convert_dcp_out.py): two gloo processes each place zero DTensors sharded ``Shard(0)``
on the 2-rank mesh, of the names, shapes and dtypes the JSON file SPEC lists, ``dcp.load`` the
checkpoint FOLDER into them, and ``torch.save`` their local shards into ``OUT/rank<r>.pt``.
"""

from __future__ import annotations

import os
import sys
import tempfile

WORLD_SIZE = 2

NON_TENSORS = {"step": 7, "blob": b"\x00\x01hurray", "note": "two ranks", "lr": 0.125}
"""The non-tensor entries (DCP keeps each as a torch.save record: BytesStorageMetadata)."""


def full_state() -> dict:
    """Every tensor of the checkpoint, whole: name -> torch tensor (deterministic values)."""
    import torch

    return {
        "rows": torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4) / 8,  # Shard(0)
        "cols": (torch.arange(3 * 5, dtype=torch.float32).reshape(3, 5) - 7).to(torch.bfloat16),  # Shard(1), uneven
        "bias": torch.linspace(-1, 1, 5, dtype=torch.float32),  # Replicate()
        "counts": torch.arange(4, dtype=torch.int64) * 3,  # a plain tensor on every rank
        "mask": torch.arange(10) % 3 == 0,  # Shard(0), bool: one byte a value in torch
    }


def large_state() -> dict:
    """The tensors of the large checkpoint (``--large``), whole: a float32 [2048, 512] saved
    ``Shard(0)`` and a bfloat16 [256, 2048] saved ``Shard(1)`` (4 MiB and 1 MiB), for reading it
    M ways with the bytes counted."""
    import torch

    return {
        "rows": (torch.arange(2048 * 512, dtype=torch.float32).reshape(2048, 512) / 64) - 7,
        "cols": torch.arange(256 * 2048, dtype=torch.float32).reshape(256, 2048).remainder(509).to(torch.bfloat16),
    }


def _large_rank(rank: int, folder: str, store: str) -> None:
    """One rank of the large checkpoint: its two DTensors, then ``dcp.save``."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD_SIZE)
    try:
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        full = large_state()
        dcp.save({"rows": distribute_tensor(full["rows"], mesh, [Shard(0)]),
                  "cols": distribute_tensor(full["cols"], mesh, [Shard(1)])}, checkpoint_id=folder)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _rank(rank: int, folder: str, store: str) -> None:
    """One rank: its DTensors placed on the mesh, then ``dcp.save`` into ``folder``."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD_SIZE)
    try:
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        full = full_state()
        state = {
            "rows": distribute_tensor(full["rows"], mesh, [Shard(0)]),
            "cols": distribute_tensor(full["cols"], mesh, [Shard(1)]),
            "bias": distribute_tensor(full["bias"], mesh, [Replicate()]),
            "counts": full["counts"].clone(),
            "mask": distribute_tensor(full["mask"], mesh, [Shard(0)]),
            **NON_TENSORS,
        }
        dcp.save(state, checkpoint_id=folder)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def save(folder: str, large: bool = False) -> None:
    """Save the checkpoint (``large``: the large one) into ``folder`` from two spawned processes."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(_large_rank if large else _rank, args=(folder, os.path.join(scratch, "store")), nprocs=WORLD_SIZE,
                 join=True)


def _load_rank(rank: int, folder: str, spec: dict, out: str, store: str) -> None:
    """One rank: zero DTensors sharded along dim 0 loaded from ``folder``; its local shards saved."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD_SIZE)
    try:
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        state = {name: distribute_tensor(torch.zeros(shape, dtype=getattr(torch, dtype)), mesh, [Shard(0)])
                 for name, (shape, dtype) in spec.items()}
        dcp.load(state, checkpoint_id=folder)
        torch.save({name: tensor.to_local().contiguous() for name, tensor in state.items()},
                   os.path.join(out, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def load(folder: str, spec_path: str, out: str) -> None:
    """Load the checkpoint ``folder`` in two spawned processes (see the module's docstring)."""
    import json

    import torch.multiprocessing as mp

    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(_load_rank, args=(folder, spec, out, os.path.join(scratch, "store")), nprocs=WORLD_SIZE, join=True)


if __name__ == "__main__":
    if sys.argv[1] == "load":
        load(*sys.argv[2:5])
    else:
        save(sys.argv[1], large="--large" in sys.argv[2:])
