"""σN-Ens under DeepSpeed ZeRO, two processes on the CPU (DeepSpeed's CPU accelerator, gloo):
ZeRO-2 (optimizer state and gradients partitioned, every parameter whole) takes the steps of
one unsharded ensemble on the whole batch; ZeRO-3, which leaves a member norm's γ empty
outside its module's forward, is refused by the diversity loss with what to use instead."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

# DeepSpeed lives in a folder of its own (`make setup` installs it there): imported in this
# process or another test's, it keeps the process group referenced after it is destroyed
DEEPSPEED = Path(sys.prefix) / "deepspeed"
pytestmark = pytest.mark.skipif(
    not (DEEPSPEED / "deepspeed").is_dir(),
    reason=f"DeepSpeed is not installed in {DEEPSPEED} (make setup installs it)",
)

SCRIPT = """\
import json
import sys

import importlib

import deepspeed
import torch
from torch import nn

import snens

# DeepSpeed's CPU accelerator compiles a shared-memory all-reduce on first use (over a minute):
# an op that only speeds its own collectives up, which gloo carries without it. (The module by
# its name: the attribute deepspeed.comm.torch is the torch package deepspeed.comm imports.)
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None

out, stage = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)


def mlp():
    return nn.Sequential(
        nn.Flatten(), nn.Linear(48, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 5)
    )


torch.manual_seed(0)
config = snens.SnensConfig(num_members=4, temperature=5.0, diversity_weight=0.01)
ens, reference = snens.convert(mlp(), config), snens.convert(mlp(), config)
reference.load_state_dict(ens.state_dict())
settings = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": stage},
    "zero_allow_untested_optimizer": True,
    "gradient_clipping": 0.0,  # DeepSpeed clips at 1.0 by default here
}
# SGD: an update linear in the gradient, so the two runs differ by float rounding only (Adam's
# first steps divide by |g|, and amplify rounding where γ's gradient is near 0)
sgd = torch.optim.SGD(snens.param_groups(ens, lr=0.1), lr=0.1)
engine, _, _, _ = deepspeed.initialize(model=ens, optimizer=sgd, config=settings)
rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
optimizer = torch.optim.SGD(snens.param_groups(reference, lr=0.1), lr=0.1)
g = torch.Generator().manual_seed(1)
try:
    for step in range(3):
        x, y = torch.randn(8, 3, 4, 4, generator=g), torch.randint(0, 5, (8,), generator=g)
        half = slice(rank * 8 // world, (rank + 1) * 8 // world)
        loss = snens.training_loss(ens, engine(x[half]), y[half]).total
        engine.backward(loss)
        engine.step()
        whole = snens.training_loss(reference, reference.train()(x), y).total
        optimizer.zero_grad()
        whole.backward()
        optimizer.step()
except RuntimeError as error:
    result = {"error": str(error)}
else:
    state, expected = ens.state_dict(), reference.state_dict()
    result = {"gap": max((state[k] - expected[k]).abs().max().item() for k in expected)}
if rank == 0:
    json.dump(result, open(out, "w"))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path, stage: int) -> dict:
    script, out = tmp_path / "zero.py", tmp_path / f"zero{stage}.json"
    script.write_text(SCRIPT)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        f"--master_port={_free_port()}", str(script), str(out), str(stage),
    ]  # fmt: skip
    path = os.pathsep.join([str(DEEPSPEED), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONPATH": path}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_zero_2_takes_the_steps_of_the_whole_ensemble(tmp_path):
    found = _run(tmp_path, 2)
    assert found.get("gap", 1.0) < 2e-5, found


def test_zero_3_is_refused_naming_what_to_use(tmp_path):
    found = _run(tmp_path, 3)
    assert "partitioned by DeepSpeed ZeRO-3" in found.get("error", ""), found
    assert "ZeRO stage 1 or 2, or shard with FSDP2" in found["error"]
