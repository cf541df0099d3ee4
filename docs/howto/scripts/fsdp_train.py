"""σN-Ens sharded with PyTorch FSDP2: `torchrun --nproc_per_node=N fsdp_train.py`.

Each transformer block is its own FSDP unit; the member norms are sharded with
their block (the diversity loss gathers γ when it reads it). Run alone, it is a
group of one process.
"""

import os

import torch
import torch.distributed as dist
import transformers
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
)
from torch.distributed.fsdp import fully_shard

import snens
import snens.engine.distributed

if "RANK" not in os.environ:  # started without torchrun: one process
    os.environ.update(
        RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29531"
    )
dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = (
    torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if torch.cuda.is_available()
    else None
)
if device is not None:
    torch.cuda.set_device(device)

torch.manual_seed(0)  # every rank builds the same model
bert = transformers.BertForSequenceClassification(
    transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=3,
    )
)  # fmt: skip
config = snens.SnensConfig(num_members=4, temperature=5.0, diversity_weight=0.01)
ens = snens.convert(bert, config)
if device is not None:
    ens.to(device)
for block in ens.model.bert.encoder.layer:
    fully_shard(block)
fully_shard(ens)
optimizer = torch.optim.AdamW(snens.param_groups(ens, lr=1e-3))  # γ at 30× the lr

g = torch.Generator().manual_seed(rank)  # each rank its own share of the data
for step in range(3):
    ids = torch.randint(1, 100, (8, 16), generator=g).to(device or "cpu")
    labels = torch.randint(0, 3, (8,), generator=g).to(device or "cpu")
    loss = snens.training_loss(
        ens, ens.train()(input_ids=ids), labels
    )  # τ, λ from config
    optimizer.zero_grad()
    loss.total.backward()
    optimizer.step()
    if rank == 0:
        print(f"step {step}: task loss {loss.task.item():.4f}")

# the whole model's weights, gathered on every rank (cpu_offload: into host memory)
state = get_model_state_dict(
    ens, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
)
if rank == 0:
    torch.save(state, "ensemble.pt")  # loads into snens.convert(fresh_bert, config)
    print(f"saved {len(state)} tensors of {world} rank(s) to ensemble.pt")
# drop the sharded model and what reaches it, then stop the group's threads
del ens, optimizer, loss, block
snens.engine.distributed.shutdown()
