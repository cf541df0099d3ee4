"""σN-Ens under PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``), in real processes over
gloo on the CPU: a converted model sharded over 2 ranks, each on half of every batch, takes the
steps of one unsharded model on the whole batch (member norms' γ, weights and heads, the
diversity loss, the parameter groups), and its full state dict loads into a fresh conversion.
Each rank then drops the sharded model and shuts the group down with
``snens.engine.distributed.shutdown``, which must find the group released (torch's DTensor
caches keep the device meshes FSDP made, each holding the group) and no gloo thread left: one
still running while the interpreter exits can abort the rank ("terminate called without an
active exception"). Two ways of sharding the member norms: kept whole from the forward to the loss
(``reshard_after_forward=False``; they are small), or resharded like every other layer, the
diversity loss then gathering γ itself.

The model is an MLP of LayerNorms (batch norms' statistics are per rank under any data
parallelism). Each rank wraps every member norm and linear layer as its own FSDP unit, then
the ensemble, as one shards a transformer block by block.
"""

import os
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="this torch build has no torch.distributed with the gloo backend",
)

SCRIPT = """\
import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

import snens
from snens.engine.distributed import shutdown
from snens.nn.norms import MemberNorm

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
CONFIG = snens.SnensConfig(num_members=4, temperature=5.0, diversity_weight=0.01)


def mlp():
    return nn.Sequential(
        nn.Flatten(), nn.Linear(48, 32), nn.LayerNorm(32), nn.GELU(),
        nn.Linear(32, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 5),
    )


torch.manual_seed(0)
ens = snens.convert(mlp(), CONFIG)
reference = snens.convert(mlp(), CONFIG)
reference.load_state_dict(ens.state_dict())
initial = {k: v.clone() for k, v in reference.state_dict().items()}
for module in ens.model.modules():
    if isinstance(module, MemberNorm) and sys.argv[2] == "gathered":
        fully_shard(module, reshard_after_forward=False)  # γ stays whole from forward to loss
    elif isinstance(module, MemberNorm | nn.Linear):
        fully_shard(module)  # γ is a DTensor again when the diversity loss reads it
fully_shard(ens)
sharded = sum(isinstance(p, torch.distributed.tensor.DTensor) for p in ens.parameters())
optimizer = torch.optim.AdamW(snens.param_groups(ens, lr=1e-2))
reference_optimizer = torch.optim.AdamW(snens.param_groups(reference, lr=1e-2))
g = torch.Generator().manual_seed(1)
for step in range(4):
    x, y = torch.randn(16, 3, 4, 4, generator=g), torch.randint(0, 5, (16,), generator=g)
    half = slice(rank * 16 // world, (rank + 1) * 16 // world)
    loss = snens.training_loss(ens, ens.train()(x[half]), y[half]).total
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    whole = snens.training_loss(reference, reference.train()(x), y).total
    reference_optimizer.zero_grad()
    whole.backward()
    reference_optimizer.step()
full = get_model_state_dict(ens, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if rank == 0:
    expected = reference.state_dict()
    gap = max((full[k] - expected[k]).abs().max().item() for k in expected)
    moved = max((full[k] - initial[k]).abs().max().item() for k in expected)
    fresh = snens.convert(mlp(), CONFIG)
    fresh.load_state_dict(full)
    x = torch.randn(8, 3, 4, 4, generator=g)
    with torch.no_grad():
        out_gap = (fresh.eval()(x) - reference.eval()(x)).abs().max().item()
    json.dump(
        {"sharded": sharded, "params": sum(1 for _ in ens.parameters()), "gap": gap,
         "out_gap": out_gap, "moved": moved, "keys": sorted(full) == sorted(expected)},
        open(sys.argv[1], "w"),
    )
# the sharded model and all that reaches it (its optimizer, a loss, the loop's last module),
# then the group: a group still held is a RuntimeWarning, an error here
del ens, optimizer, loss, module, full
with warnings.catch_warnings():
    warnings.simplefilter("error")
    shutdown()
names = []
for task in Path("/proc/self/task").glob("*"):  # Linux: the process's threads, by name
    try:
        names.append(task.joinpath("comm").read_text().strip())
    except FileNotFoundError:  # a thread that ended meanwhile
        pass
gloo = sorted(name for name in names if "gloo" in name)
assert not gloo, f"rank {rank}: gloo threads still running after shutdown(): {gloo}"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("norms", ["gathered", "resharded"])
def test_a_sharded_ensemble_takes_the_steps_of_the_whole_one(tmp_path, norms):
    import json

    script = tmp_path / "fsdp_step.py"
    script.write_text(SCRIPT)
    result = tmp_path / "result.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        f"--master_port={_free_port()}", str(script), str(result), norms,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(result.read_text())
    # every parameter sharded: 2 linears and the member head (w, b), 2 member norms (w, b, γ)
    assert found["sharded"] == found["params"] == 3 * 2 + 2 * 3
    assert found["keys"]  # the full state dict names every tensor of the unsharded ensemble
    assert found["gap"] < 2e-5, found  # the same steps, to float32 rounding
    assert found["out_gap"] < 2e-5, found
    assert found["moved"] > 1e-3, found  # it trained
