"""σN-Ens-LoRA on SmolLM2's architecture (a 2-layer Llama, random weights) under FSDP2, two
processes over gloo on the CPU: it trains, checkpoints (the whole model's and the optimizer's
state, gathered), resumes from the checkpoint in a new pair of processes, and the trained
ensemble reloads into one process with the same outputs. A run resumed after step 2 ends where
an uninterrupted run of 4 steps ends.
"""

import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import snens

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="this torch build has no torch.distributed with the gloo backend",
)

# argv: out directory, steps, then "resume" to start from out/checkpoint.pt
SCRIPT = """\
import json
import sys
import warnings
from pathlib import Path

import peft
import torch
import torch.distributed as dist
import transformers
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard

import snens
from snens.engine.distributed import shutdown

out, steps, resume = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["resume"]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
CONFIG = snens.SnensConfig(num_members=2, temperature=5.0, diversity_weight=0.01)


def ensemble():
    torch.manual_seed(0)
    base = transformers.LlamaForSequenceClassification(transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, num_labels=3,
    ))
    targets = ["q_proj", "v_proj"]
    lora = peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=targets)
    return snens.convert(peft.get_peft_model(base, lora), CONFIG)


def batch(step):
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(1, 100, (8, 12), generator=g)
    labels = torch.randint(0, 3, (8,), generator=g)
    half = slice(rank * 8 // world, (rank + 1) * 8 // world)
    return ids[half], labels[half]


ens = ensemble()
for layer in ens.model.base_model.model.model.layers:
    fully_shard(layer)
fully_shard(ens)
optimizer = torch.optim.AdamW(snens.param_groups(ens, lr=1e-2))
full = StateDictOptions(full_state_dict=True, cpu_offload=True)
start = 0
if resume:
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    set_state_dict(
        ens, optimizer, model_state_dict=saved["model"], optim_state_dict=saved["optimizer"],
        options=StateDictOptions(full_state_dict=True),
    )
    start = saved["step"]
    del saved  # set_state_dict filled it with sharded tensors, which hold the group
for step in range(start, steps):
    ids, labels = batch(step)
    loss = snens.training_loss(ens, ens.train()(input_ids=ids), labels)
    optimizer.zero_grad()
    loss.total.backward()
    optimizer.step()
model_state, optimizer_state = get_state_dict(ens, optimizer, options=full)
ids = torch.randint(1, 100, (3, 12), generator=torch.Generator().manual_seed(99))
with torch.no_grad():
    logits = ens.eval()(input_ids=ids)
if rank == 0:
    saved = {"model": model_state, "optimizer": optimizer_state, "step": steps}
    torch.save(saved, out / "checkpoint.pt")
    torch.save(logits, out / "logits.pt")
# the sharded model and what reaches it, then the group: a group still held is an error here
# (its threads would run on into the interpreter's exit, where one can abort the rank)
del ens, optimizer, loss, layer
with warnings.catch_warnings():
    warnings.simplefilter("error", RuntimeWarning)
    shutdown()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(script, out, *args):
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        f"--master_port={_free_port()}", str(script), str(out), *args,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def _ensemble():
    torch.manual_seed(0)
    base = transformers.LlamaForSequenceClassification(
        transformers.LlamaConfig(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, num_labels=3,
        )
    )  # fmt: skip
    lora = peft.LoraConfig(
        task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]
    )
    config = snens.SnensConfig(num_members=2, temperature=5.0, diversity_weight=0.01)
    return snens.convert(peft.get_peft_model(base, lora), config)


def test_sharded_lora_ensemble_trains_checkpoints_resumes_and_reloads(tmp_path):
    script = tmp_path / "fsdp_lora.py"
    script.write_text(SCRIPT)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    whole.mkdir(), resumed.mkdir()
    _run(script, whole, "4")  # 4 steps at once
    _run(script, resumed, "2")  # 2 steps, checkpoint, then 2 more in new processes
    _run(script, resumed, "4", "resume")
    a = torch.load(whole / "checkpoint.pt", weights_only=True)
    b = torch.load(resumed / "checkpoint.pt", weights_only=True)
    gap = max((a["model"][k] - b["model"][k]).abs().max().item() for k in a["model"])
    assert gap < 1e-6, gap  # the resumed run ends where the uninterrupted one ends
    # the gathered weights reload into one process: the same outputs as the sharded ensemble
    ens = _ensemble()
    before = {k: v.clone() for k, v in ens.state_dict().items()}
    ens.load_state_dict(a["model"])
    moved = max((ens.state_dict()[k] - before[k]).abs().max().item() for k in before)
    assert moved > 1e-3  # it trained
    ids = torch.randint(1, 100, (3, 12), generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        logits = ens.eval()(input_ids=ids)
    torch.testing.assert_close(logits, torch.load(whole / "logits.pt"), rtol=1e-5, atol=1e-5)
    assert (logits[0] - logits[1]).abs().max() > 1e-4  # two members, each restored
