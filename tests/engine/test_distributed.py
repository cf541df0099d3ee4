"""Data-parallel training with real processes over gloo on the CPU: sharding, the 1-vs-2-process
comparison, and a rank that dies.

Every run: the ``fashion_mnist_small_cnn_tiny`` preset (σN-Ens, M=4, width-4 small CNN), 800
training images in 8 global batches of 100 per epoch, 3 epochs, 1 thread per process; a
2-process run takes about 8 s on a 2-core machine, a 1-process run about 4 s.
"""

import gc
import json
import os
import socket
import subprocess
import sys
import time
import warnings
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from snens.data import TensorLoader
from snens.engine.distributed import local_batch_size, shutdown

if dist.is_available():  # imported before any group is made, as a script does at its top
    from torch.distributed.fsdp import fully_shard

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="this torch build has no torch.distributed with the gloo backend",
)

EPOCHS = 3
SETTINGS = (
    "threads=1",
    "deterministic=true",
    "data.train_examples=800",
    "data.test_examples=500",
    "data.ood_examples=200",
    f"optim.epochs={EPOCHS}",
    "optim.lr=0.02",
)
TIMEOUT_S = 120  # per command; each takes under 10 s on an idle 2-core machine
# `accelerate launch` of 2 processes importing transformers and peft: ~25 s on an idle 2-core
# machine, several minutes on one shared with training jobs (it had failed there once at 120 s
# and passed alone); the limit only catches a hang, so it leaves room for any load.
LAUNCH_TIMEOUT_S = 600

# Rank 1 dies (as a SIGKILL would: no cleanup, no exception) right after its n-th step.
DYING_RANK = """\
import os
import sys

import torch

from snens.engine.cli import main

if os.environ.get("RANK") == "1":
    step, steps = torch.optim.AdamW.step, []

    def step_then_die(self, *args, **kwargs):
        step(self, *args, **kwargs)
        steps.append(1)
        if len(steps) == {die_after}:
            os._exit(17)

    torch.optim.AdamW.step = step_then_die
sys.exit(main(sys.argv[1:]))
"""


# train() in each rank of torchrun, then a line with the names of the rank's threads when the
# group is shut down (entering distributed.shutdown) and once train() has returned.
THREADS_AFTER_TRAINING = """\
import json
import os
import sys
from pathlib import Path

from snens.engine import distributed
from snens.engine.cli import main


def threads():
    names = []
    tasks = Path("/proc/self/task")
    for task in tasks.iterdir() if tasks.is_dir() else ():
        try:
            names.append((task / "comm").read_text().strip())
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return sorted(names)


seen = {}
shutdown = distributed.shutdown


def shutdown_seen():
    seen.setdefault("at_shutdown", threads())  # the first call: leave(), the group still up
    shutdown()


distributed.shutdown = shutdown_seen
code = main(sys.argv[1:])
seen["after"] = threads()
print("THREADS " + json.dumps({"rank": int(os.environ["RANK"]), **seen}), flush=True)
sys.exit(code)
"""

LINUX_THREADS = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="reads thread names from /proc/self/task"
)


def _gloo_threads() -> list[str]:
    """The names of this process's threads that belong to gloo (its workers, its event loop)."""
    names = []
    for task in Path("/proc/self/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return sorted(name for name in names if "gloo" in name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}


def _train_args(out: Path, name: str) -> list[str]:
    sets = [x for s in (*SETTINGS, f"name={json.dumps(name)}") for x in ("--set", s)]
    args = ["train", "--preset", "fashion_mnist_small_cnn_tiny", *sets]
    return [*args, "--no-progress", "--out", str(out)]


def _dying_rank(directory: Path, die_after: int) -> str:
    script = directory / f"dying_rank_{die_after}.py"
    script.write_text(DYING_RANK.replace("{die_after}", str(die_after)))
    return str(script)


def _torchrun(target: list[str], args: list[str]) -> subprocess.CompletedProcess:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    return subprocess.run(
        [*launcher, "--master_port", str(_free_port()), *target, *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _final(run_dir: Path) -> dict:
    return json.loads((run_dir / "final.json").read_text())["metrics"]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> tuple[Path, float, list[dict]]:
    """An uninterrupted 2-process run: its directory, its wall time in seconds and each rank's
    thread names (THREADS_AFTER_TRAINING; [] where /proc/self/task is missing)."""
    out = tmp_path_factory.mktemp("ddp")
    script = tmp_path_factory.mktemp("script") / "threads.py"  # rank 0 alone writes in out
    script.write_text(THREADS_AFTER_TRAINING)
    start = time.perf_counter()
    result = _torchrun([str(script)], _train_args(out, "two"))
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr[-3000:]
    assert "still referenced" not in result.stderr, result.stderr[-3000:]  # shutdown's warning
    lines = [line for line in result.stdout.splitlines() if line.startswith("THREADS ")]
    return out / "two", seconds, [json.loads(line.removeprefix("THREADS ")) for line in lines]


# ------------------------------------------------------------------------------------------------
# Sharding (in process)
# ------------------------------------------------------------------------------------------------


def test_shards_are_disjoint_and_together_the_global_batch():
    images = torch.randint(0, 256, (50, 1, 8, 8), dtype=torch.uint8)
    labels = torch.arange(50)

    def loader(rank: int = 0, world_size: int = 1) -> TensorLoader:
        options = {"shuffle": True, "drop_last": True, "augment": ("crop", "flip"), "seed": 3}
        return TensorLoader(images, labels, 12, **options).shard(rank, world_size)

    for epoch in (0, 1):
        single = loader()
        single.set_epoch(epoch)
        shards = [loader(rank, 2) for rank in (0, 1)]
        for shard in shards:
            shard.set_epoch(epoch)
        assert len(shards[0]) == len(single) == 4
        for (x, y), (x0, y0), (x1, y1) in zip(single, *shards, strict=True):
            assert len(y0) == len(y1) == 6
            assert not set(y0.tolist()) & set(y1.tolist())
            torch.testing.assert_close(torch.cat([x0, x1]), x, rtol=0, atol=0)
            torch.testing.assert_close(torch.cat([y0, y1]), y, rtol=0, atol=0)


def test_batch_size_must_split_evenly():
    with pytest.raises(ValueError, match=r"batch_size 100 is not divisible by the 3 processes"):
        local_batch_size(100, 3)
    with pytest.raises(ValueError, match=r"batch_size 10 is not divisible by world_size 4"):
        TensorLoader(torch.zeros(20, 2), torch.zeros(20), 10).shard(0, 4)


# ------------------------------------------------------------------------------------------------
# Real processes
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_learn_like_one(two_processes, tmp_path):
    """A 2-process run against a 1-process run with the same global batch (100) and seed.

    Both start from the same weights and see the same examples in each step, and DDP's average
    of the two shards' gradients is the global batch's gradient. They are not equal, though:
    BatchNorm (here the members' norms) normalizes each rank's 50 examples with their own
    mean and variance, and rank 0's running statistics come from its shard alone. Measured
    (800 images, 3 epochs): test accuracy 0.306 (2 processes) vs 0.304 (1), per-epoch losses
    within 0.04, test NLL 1.867 vs 1.893. So the test asserts what that allows: both learn
    (loss falls, accuracy well above the 0.1 of chance) and agree within 0.05 accuracy and
    0.1 in each epoch's loss and in test NLL.
    """
    two_dir, two_seconds, _ = two_processes
    one = subprocess.run(
        [sys.executable, "-m", "snens.engine.cli", *_train_args(tmp_path, "one")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert one.returncode == 0, one.stderr[-3000:]

    # rank 0 alone writes: one line per epoch, one final.json, one run directory
    assert [p.name for p in two_dir.parent.iterdir()] == ["two"]
    two_log, one_log = _metrics(two_dir), _metrics(tmp_path / "one")
    assert [r["epoch"] for r in two_log] == list(range(1, EPOCHS + 1))
    assert [r["step"] for r in two_log] == [r["step"] for r in one_log]
    assert (two_dir / "last.pt").is_file()

    losses = [r["task_loss"] for r in two_log]
    assert losses[-1] < losses[0] - 0.2, losses
    for a, b in zip(losses, (r["task_loss"] for r in one_log), strict=True):
        assert abs(a - b) < 0.1, (losses, one_log)

    two_final, one_final = _final(two_dir), _final(tmp_path / "one")
    print(
        f"2 processes: accuracy {two_final['test/accuracy']:.4f}, NLL "
        f"{two_final['test/nll']:.4f}, {two_seconds:.1f} s; 1 process: accuracy "
        f"{one_final['test/accuracy']:.4f}, NLL {one_final['test/nll']:.4f}"
    )
    for final in (two_final, one_final):
        assert final["test/accuracy"] > 0.2
    assert abs(two_final["test/accuracy"] - one_final["test/accuracy"]) <= 0.05
    assert abs(two_final["test/nll"] - one_final["test/nll"]) <= 0.1


@pytest.mark.slow
def test_resume_under_torchrun_gives_the_same_metrics(two_processes, tmp_path):
    """Rank 1 dies in epoch 2 (step 9 of 24); the 2-process resume from epoch 1's checkpoint,
    which every rank loads, ends with the uninterrupted run's metrics, bitwise."""
    cut = _torchrun([_dying_rank(tmp_path, 9)], _train_args(tmp_path, "cut"))
    assert cut.returncode != 0
    assert [r["epoch"] for r in _metrics(tmp_path / "cut")] == [1]
    resumed = _torchrun(
        ["-m", "snens.engine.cli"], ["train", "--resume", str(tmp_path / "cut"), "--no-progress"]
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _final(tmp_path / "cut") == _final(two_processes[0])

    def untimed(run_dir: Path) -> list[dict]:  # wall seconds and peak memory vary run to run
        measured = {"seconds", "peak_rss_mib", "peak_cuda_mib"}
        return [{k: v for k, v in r.items() if k not in measured} for r in _metrics(run_dir)]

    assert untimed(tmp_path / "cut") == untimed(two_processes[0])


@pytest.mark.slow
def test_a_dying_rank_ends_the_torchrun_command(tmp_path):
    start = time.perf_counter()
    result = _torchrun([_dying_rank(tmp_path, 1)], _train_args(tmp_path, "dies"))
    seconds = time.perf_counter() - start
    assert result.returncode != 0
    assert seconds < 60
    output = result.stdout + result.stderr
    assert "exitcode  : 17" in output, output[-3000:]  # torchrun names the rank that died
    assert not (tmp_path / "dies" / "final.json").exists()


@pytest.mark.slow
def test_the_surviving_rank_raises_lost_contact(tmp_path):
    """Without torchrun to tear it down, rank 0 itself stops with a clear error, not a hang."""
    script = _dying_rank(tmp_path, 1)
    group = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2"}
    group["SNENS_DIST_TIMEOUT"] = "30"
    command = [sys.executable, script, *_train_args(tmp_path, "alone")]
    start = time.perf_counter()
    ranks = [
        subprocess.Popen(
            command,
            env=_env(**group, RANK=str(rank), LOCAL_RANK=str(rank)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        errors = [rank.communicate(timeout=TIMEOUT_S)[1] for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
    seconds = time.perf_counter() - start
    assert ranks[1].returncode == 17
    assert ranks[0].returncode != 0
    assert seconds < 60
    assert "RuntimeError: rank 0 lost contact with the group of 2 during epoch 1" in errors[0], (
        errors[0][-3000:]
    )


@pytest.mark.slow
@LINUX_THREADS
def test_every_rank_stops_the_groups_threads_before_train_returns(two_processes):
    """Rank 1 aborted at exit ("terminate called without an active exception", SIGABRT, so
    torchrun killed rank 0 mid-evaluation): the gloo worker that ran the final barrier freed
    that barrier's work, and with it the loss all-reduce the barrier had waited on, after the
    interpreter had begun to exit, and freeing that all-reduce's tensor takes the GIL.
    ``destroy_process_group`` had stopped no thread (the DDP wrapper and the defaults of
    torch.distributed.nn.functional still held the group); now no gloo thread outlives
    ``train()`` on any rank, so none is left to run while the interpreter exits."""
    seen = two_processes[2]
    assert sorted(rank["rank"] for rank in seen) == [0, 1]
    for rank in seen:
        assert any("gloo" in name for name in rank["at_shutdown"]), rank  # they did run
        assert not [name for name in rank["after"] if "gloo" in name], rank


@pytest.fixture
def one_process_group():
    """A gloo group of this process alone (a store in memory); destroyed after the test if the
    test left it."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@LINUX_THREADS
def test_shutdown_stops_the_threads_of_a_group_nothing_else_holds(one_process_group):
    total = torch.ones(3)
    dist.all_reduce(total)  # a collective on a tensor Python made, as Context.mean's
    assert _gloo_threads()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shutdown()
    assert not dist.is_initialized()
    assert _gloo_threads() == []
    shutdown()  # without a group: nothing to do


@LINUX_THREADS
def test_shutdown_warns_naming_what_still_holds_the_group(one_process_group):
    held = dist.group.WORLD  # as a DistributedDataParallel wrapper holds it
    match = r"still referenced, so its worker threads run on.*drop every DistributedDataParallel"
    with pytest.warns(RuntimeWarning, match=match):
        shutdown()
    assert not dist.is_initialized()
    assert _gloo_threads()
    del held
    assert _gloo_threads() == []


@LINUX_THREADS
def test_shutdown_releases_a_group_that_fsdp_device_meshes_held(one_process_group):
    """After an FSDP2 model's steps, torch's DTensor caches keep the device meshes it made, each
    holding the group: ``dist.destroy_process_group()`` alone left gloo's threads running. With
    the model dropped, ``shutdown`` empties those caches and the threads stop."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        model(torch.randn(3, 4)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    held_by_caches = weakref.ref(dist.group.WORLD)
    del model, optimizer, layer
    gc.collect()
    assert _gloo_threads()  # they ran
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a group still held: a RuntimeWarning, an error here
        shutdown()
    assert held_by_caches() is None
    assert _gloo_threads() == []


@LINUX_THREADS
def test_shutdown_names_sharded_tensors_left_alive_as_what_holds_the_group(one_process_group):
    """A state dict that ``set_state_dict`` filled with sharded tensors, kept after loading,
    holds the group through their device mesh: the warning says so and how to drop it, and
    once it is dropped the threads stop."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    loaded = {"weight": distribute_tensor(torch.ones(4), mesh, [Replicate()])}
    del mesh
    match = r"still referenced.*1 sharded tensors \(DTensor\) are still alive.*set_state_dict"
    with pytest.warns(RuntimeWarning, match=match):
        shutdown()
    assert _gloo_threads()
    del loaded
    gc.collect()
    assert _gloo_threads() == []


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    """A causal LM of SmolLM2's kind (its tokenizer and vocabulary, Llama layers) but 2 layers
    of width 64:
    the LLM path end to end in seconds."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("peft")
    pytest.importorskip("gguf")
    from snens.models.llm import smollm2_path

    source = smollm2_path()
    path = tmp_path_factory.mktemp("tiny_llm")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    tokenizer.save_pretrained(path)
    config = transformers.LlamaConfig.from_pretrained(str(source)).to_dict()
    config.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, head_dim=16)
    config.update(num_attention_heads=4, num_key_value_heads=2)
    config = transformers.LlamaConfig.from_dict(config)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.mark.slow
def test_llm_lora_snens_trains_under_torchrun(tiny_llm, tmp_path):
    """σN-Ens over a LoRA-adapted LLM, launched as LLM users launch it: 2 processes (gloo)."""
    sets = [
        f"model.options.path={json.dumps(str(tiny_llm))}",
        "data.train_examples=32",
        "data.test_examples=16",
        "data.ood_examples=8",
        "data.batch_size=8",
        "data.max_length=24",
        "optim.epochs=1",
        "threads=1",
        'name="llm"',
    ]
    args = ["train", "--preset", "rotten_tomatoes_smollm2", "--no-progress", "--out", str(tmp_path)]
    result = _torchrun(
        ["-m", "snens.engine.cli"], [*args, *(x for s in sets for x in ("--set", s))]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == ["llm"]  # rank 0 alone writes
    (record,) = _metrics(tmp_path / "llm")
    assert record["step"] == 4  # 32 texts in global batches of 8, each rank taking 4 of them
    # the run says how it was launched: world size, backend, the launcher
    launch = json.loads((tmp_path / "llm" / "provenance.json").read_text())["distributed"]
    assert launch["world_size"] == 2 and launch["backend"] == "gloo"
    assert launch["launcher"] == "torchrun" and launch["nproc_per_node"] == 2
    final = _final(tmp_path / "llm")
    assert final["test/num_members"] == 4.0 and 0.0 <= final["test/accuracy"] <= 1.0
    assert 0.0 < final["test/nll"] < 5.0


# SnensTrainer over a LoRA-adapted Llama of 2 layers (random weights), 64 token sequences whose
# label is the parity of their first token; each rank writes what it trained.
ACCELERATE_SCRIPT = """\
import json
import sys
from pathlib import Path

import peft
import torch
import transformers
from accelerate import PartialState
from transformers import TrainingArguments

import snens
from snens.engine.distributed import shutdown
from snens.integrations.huggingface import SnensTrainer

out = sys.argv[1]
torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, num_labels=2, pad_token_id=0,
)
lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="SEQ_CLS")
model = peft.get_peft_model(transformers.LlamaForSequenceClassification(config), lora)
ens = snens.convert(model, num_members=4)


def sums():
    with torch.no_grad():
        return {n: p.double().sum().item() for n, p in ens.named_parameters() if p.requires_grad}


before = sums()
ids = torch.randint(1, 64, (64, 8), generator=torch.Generator().manual_seed(1))
mask = torch.ones(8, dtype=torch.long)
rows = [{"input_ids": x, "attention_mask": mask, "labels": x[0] % 2} for x in ids]
args = TrainingArguments(
    output_dir=out, per_device_train_batch_size=8, num_train_epochs=1, learning_rate=1e-2,
    report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True, logging_steps=1,
    seed=0, dataloader_num_workers=0,
)
trainer = SnensTrainer(model=ens, args=args, train_dataset=rows, gamma_lr_multiplier=10.0)
trainer.train()
state = PartialState()
gamma = [g["initial_lr"] for g in trainer.optimizer.param_groups if g.get("name") == "gamma"]
record = {
    "world": state.num_processes,
    "backend": torch.distributed.get_backend() if state.num_processes > 1 else None,
    "steps": trainer.state.global_step,
    "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
    "gamma_lr": gamma,
    "before": before,
    "trained": sums(),
}
# The end of a multi-process script: the trainer (its DDP wrapper holds the group) goes, then
# the group, whose gloo threads must stop before the interpreter exits: one freeing a tensor
# then (the loss all-gather's) aborted the rank, "terminate called without an active exception".
del trainer
shutdown()
tasks = Path("/proc/self/task")
names = [(t / "comm").read_text().strip() for t in tasks.iterdir()] if tasks.is_dir() else []
record["gloo_threads"] = [name for name in names if "gloo" in name]
with open(f"{out}/rank{state.process_index}.json", "w") as f:
    json.dump(record, f)
"""


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 120)  # the launch's limit decides, not the suite's
def test_snens_trainer_under_accelerate_launch(tmp_path):
    """The Trainer path launched as its users launch it: `accelerate launch`, 2 CPU processes
    (accelerate's multi-process launcher; its `--cpu` flag alone starts one process)."""
    pytest.importorskip("accelerate")
    pytest.importorskip("peft")
    pytest.importorskip("transformers")
    script = tmp_path / "train.py"
    script.write_text(ACCELERATE_SCRIPT)
    for _ in range(3):  # a port taken between _free_port and the launch (a busy machine)
        command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu"]
        command += ["--num_processes", "2", "--num_machines", "1", "--main_process_port"]
        command += [str(_free_port()), "--mixed_precision", "no", "--dynamo_backend", "no"]
        result = subprocess.run(
            [*command, str(script), str(tmp_path)],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=LAUNCH_TIMEOUT_S,
        )
        if "address already in use" not in result.stderr.lower():
            break
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert "still referenced" not in result.stderr, result.stderr[-3000:]  # shutdown's warning
    for record in ranks:
        assert record["gloo_threads"] == []  # the script's shutdown() stopped them
        assert record["world"] == 2 and record["backend"] == "gloo"
        assert record["steps"] == 64 // (8 * 2)  # a global batch of 16, 8 per rank
        assert record["gamma_lr"] == [pytest.approx(0.1)]  # γ at lr × 10 in its own group
        assert len(record["losses"]) == 4 and all(0.3 < x < 1.5 for x in record["losses"])
    # the ranks stay one model: every trained tensor (LoRA, member γ/β, member heads) the same
    first, second = (r["trained"] for r in ranks)
    assert first.keys() == second.keys()
    for name in first:
        assert first[name] == pytest.approx(second[name], rel=1e-6, abs=1e-9), name
    # …and trained: the LoRA factors and the member norms' γ moved
    moved = {name for name in first if first[name] != ranks[0]["before"][name]}
    assert any("lora_B" in name for name in moved) and any("gamma" in name for name in moved)
    assert ranks[0]["losses"] == ranks[1]["losses"]  # the logged loss is averaged over ranks
