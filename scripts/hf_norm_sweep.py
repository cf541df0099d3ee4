"""Which Hugging Face models snens.convert converts exactly, which it refuses and why.

Claim: every ``*ForSequenceClassification``, ``*ForImageClassification`` and ``*ForCausalLM``
class of the installed transformers that builds from a tiny config either converts with every
member reproducing the model (max |member − plain| of the eval logits, M = 2, its norm weights
randomized first so that an identity cannot pass) or is refused with the reason of each norm
class it does not convert (all or nothing: ``skip_unsupported=False``; the refused model's gap
with those norms left shared, as the default leaves them, is reported too); none fails
otherwise.

Runs each class once, on the CPU, in float32, from its config class's defaults shrunk to a few
layers of width 32 (no downloads: ``HF_HUB_OFFLINE=1``); a class whose config or model cannot
be built that small, or that does not run on a token or pixel batch, is skipped and counted.
Prints a Markdown summary (versions, hardware, counts, the refused norm classes with their
reasons, every model's row)::

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python scripts/hf_norm_sweep.py [--only Llama,Bert]
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import signal
import time
import traceback
from collections import Counter, defaultdict

import torch
from torch import nn

import snens
from snens.nn.registry import is_norm, lookup

HEADS = ("ForSequenceClassification", "ForImageClassification", "ForCausalLM")
#: A member equals the model within this times max(1, max |logit|) (float32 logits through a
#: few layers: CPM-Ant's reach 18, and their rounding 1e-4).
EXACT = 1e-5
#: Seconds one model may take to build, convert and run.
PER_MODEL_S = 120
MAX_PARAMS = 20_000_000
B, T, IMAGE, NUM_LABELS = 2, 8, 32, 3

#: Config fields set on every (sub-)config that has them.
SMALL = {
    "hidden_size": 32,
    "d_model": 32,
    "n_embd": 32,
    "embed_dim": 32,
    "embedding_size": 32,
    "dim": 32,
    "intermediate_size": 64,
    "ffn_dim": 64,
    "d_ff": 64,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "n_inner": 64,
    "num_hidden_layers": 2,
    "num_layers": 2,
    "n_layer": 2,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "num_decoder_layers": 2,
    "num_attention_heads": 2,
    "n_head": 2,
    "num_heads": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "n_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "d_kv": 16,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "n_positions": 64,
    "image_size": IMAGE,
    "patch_size": 4,
    "num_labels": NUM_LABELS,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "pad_token_id": 0,
}


def tiny_config(config_class, kinds: bool = False):
    """The config class's defaults with :data:`SMALL` where it has those fields, per-layer
    lists cut to the layers kept (their first entries; with ``kinds``, for lists of layer
    kinds, the first layer of each kind, so that a hybrid keeps its kinds of layer), per-stage
    sizes small (as many stages), and its sub-configs shrunk alike."""
    default = config_class()
    return config_class(**_small(default.to_dict(), kinds))


#: Fields a tiny config drops: backbone outputs and per-layer overrides of the full depth.
DROPPED = ("out_indices", "out_features", "per_layer_config")


def _small(fields: dict, kinds: bool = False) -> dict:
    values = {}
    layers = fields.get("num_hidden_layers")
    for key, value in fields.items():
        if key in DROPPED:
            values[key] = None
        elif key in SMALL and not isinstance(value, list | dict):
            values[key] = SMALL[key]
        elif isinstance(value, list) and value and layers and len(value) == layers:
            values[key] = _per_layer(value, kinds)  # one entry per layer
        elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            values[key] = _small_stages(key, value)
        elif isinstance(value, dict) and ("model_type" in value or key.endswith("config")):
            values[key] = {**value, **_small(value, kinds)}
    return values


def _per_layer(value: list, kinds: bool) -> list:
    """A per-layer list cut to the layers kept: its first entries; with ``kinds``, for layer
    kinds (strings: a hybrid's "linear_attention" and "full_attention", "mamba" and
    "attention"), the first layer of each of the first kinds, so that a hybrid keeps its kinds
    of layer (and their norms) at two layers."""
    kept = SMALL["num_hidden_layers"]
    if kinds and all(isinstance(v, str) for v in value):
        firsts = sorted({v: i for i, v in reversed(list(enumerate(value)))}.values())
        indices = sorted((firsts + [i for i in range(len(value)) if i not in firsts])[:kept])
        return [value[i] for i in indices]
    return value[:kept]


def _small_stages(key: str, value: list[int]) -> list[int]:
    if any(word in key for word in ("patch", "stride", "padding", "kernel", "ratio")):
        return value
    if "depth" in key or "layers" in key or "head" in key:
        return [1] * len(value)
    if "size" in key or "dim" in key or "channels" in key:
        return [32 * (i + 1) for i in range(len(value))]  # group norms of 32 groups divide them
    return value


def inputs_for(model: nn.Module, config, head: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if model.main_input_name == "pixel_values":
        channels = getattr(config, "num_channels", 3)
        size = getattr(config, "image_size", IMAGE)
        size = size[0] if isinstance(size, list | tuple) else size
        return {"pixel_values": torch.randn(B, channels, size, size, generator=g)}
    vocab = getattr(config, "vocab_size", None) or getattr(
        getattr(config, "text_config", None), "vocab_size", 128
    )
    ids = torch.randint(3, min(vocab, 128), (B, T), generator=g)
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, int) and eos < vocab:
        ids[:, -1] = eos  # encoder-decoders classify at the eos token
    return {"input_ids": ids, "attention_mask": torch.ones(B, T, dtype=torch.long)}


def logits_of(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out[0]


def randomize_norms(model: nn.Module) -> None:
    """Norm weights and biases off their 1 and 0, as a trained model's are."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if is_norm(module):
                for p in module.parameters(recurse=False):
                    p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))


@contextlib.contextmanager
def time_limit(seconds: int):
    def stop(signum, frame):
        raise TimeoutError(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _build(name: str, head: str, kinds: bool):
    """(model, inputs, reference logits, parameter count) of a class built tiny; raises where
    it does not build or run."""
    import transformers

    with time_limit(PER_MODEL_S):
        cls = getattr(transformers, name)
        config = tiny_config(cls.config_class, kinds)
        torch.manual_seed(0)
        model = cls(config).eval()
        params = sum(p.numel() for p in model.parameters())
        if params > MAX_PARAMS:
            return model, None, None, params
        randomize_norms(model)
        inputs = inputs_for(model, config, head)
        with torch.no_grad():
            ref = logits_of(model(**inputs))
    return model, inputs, ref, params


def sweep_one(name: str) -> dict:

    head = next(h for h in HEADS if name.endswith(h))
    row = {"model": name, "head": head}
    try:
        model, inputs, ref, params = _build(name, head, kinds=False)
    except Exception as err:  # noqa: BLE001 - a model that does not build tiny is counted
        try:  # a hybrid whose first two layers are of one kind: one layer of each kind
            model, inputs, ref, params = _build(name, head, kinds=True)
        except Exception:  # noqa: BLE001 - the first reason is reported
            return {**row, "outcome": "skipped", "why": _short(err)}
    if params > MAX_PARAMS:
        return {**row, "outcome": "skipped", "why": f"{params:,} parameters at tiny size"}
    memo: dict = {}
    refused = {}
    for _, module in model.named_modules():
        found = lookup(module, memo)
        if isinstance(found, str):
            refused.setdefault(type(module).__name__, found)
    row["params"] = params
    try:
        with time_limit(PER_MODEL_S):
            started = time.perf_counter()
            generator = torch.Generator().manual_seed(0)
            ens = snens.convert(
                model, 2, output=logits_of, generator=generator, skip_unsupported=False
            ).eval()
            row["convert_s"] = time.perf_counter() - started
            with torch.no_grad():
                out = ens(**inputs)
    except TypeError as err:
        if refused and "no member version" in str(err):
            shared = _shared_gap(model, inputs, ref)
            return {**row, "outcome": "refused", "refused": refused, "shared": shared}
        return {**row, "outcome": "failed", "why": _short(err), "trace": _trace()}
    except ValueError as err:
        if "no supported norm layer" in str(err):
            return {**row, "outcome": "no norm", "why": "no norm layer"}
        return {**row, "outcome": "failed", "why": _short(err), "trace": _trace()}
    except Exception as err:  # noqa: BLE001 - any other failure is the sweep's finding
        return {**row, "outcome": "failed", "why": _short(err), "trace": _trace()}
    gap = _gap(out, ref)
    converted = Counter(member for _, _, member in ens.report.converted)
    row.update(gap=gap, converted=dict(converted), norms=len(ens.report.converted))
    row["outcome"] = "exact" if gap <= EXACT * max(1.0, float(ref.abs().max())) else "inexact"
    return row


def _gap(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max over members of max |member − plain|."""
    return max(float((out[m].float() - ref.float()).abs().max()) for m in range(out.shape[0]))


def _shared_gap(model: nn.Module, inputs: dict, ref: torch.Tensor) -> str:
    """A refused model converted with its refused norms left shared (skip_unsupported=True,
    what the default does with a warning): its gap, or why it fails."""
    try:
        with time_limit(PER_MODEL_S), torch.no_grad():
            ens = snens.convert(model, 2, output=logits_of, skip_unsupported=True).eval()
            return f"{_gap(ens(**inputs), ref):.1e}"
    except ValueError as err:
        if "no supported norm layer" in str(err):
            return "none (no norm left to convert)"
        return _short(err)
    except Exception as err:  # noqa: BLE001 - reported as it is
        return _short(err)


def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".replace("\n", " ").replace("|", "/")
    return text[:200]


def _trace() -> str:
    return traceback.format_exc(limit=-3)


def report(rows: list[dict], seconds: float) -> str:
    import transformers

    counts = Counter(r["outcome"] for r in rows)
    lines = [
        "# Hugging Face norm sweep",
        "",
        f"transformers {transformers.__version__}, torch {torch.__version__}, "
        f"Python {platform.python_version()}, {platform.machine()} CPU, "
        f"{torch.get_num_threads()} thread(s); {seconds:.0f} s. M = 2, float32, eval; "
        f"exact: max |member − plain| ≤ {EXACT:g} · max(1, max |logit|). A refused "
        "model's detail gives its gap converted with skip_unsupported=True (refused norms "
        "shared).",
        "",
        "| outcome | models |",
        "|---|---|",
    ]
    for outcome in ("exact", "inexact", "refused", "no norm", "failed", "skipped"):
        lines.append(f"| {outcome} | {counts.get(outcome, 0)} |")
    lines.append(f"| total | {len(rows)} |")
    built = [r for r in rows if r["outcome"] != "skipped"]
    gaps = [r["gap"] for r in built if "gap" in r]
    if gaps:
        lines += ["", f"Largest member gap among converted models: {max(gaps):.2e}."]
    member_counts: Counter = Counter()
    for r in built:
        member_counts.update(r.get("converted", {}))
    lines += ["", "## Member norms built", "", "| member class | norms |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in member_counts.most_common()]
    reasons: dict[str, tuple[str, list[str]]] = {}
    for r in built:
        for kind, reason in r.get("refused", {}).items():
            reasons.setdefault(kind, (reason, []))[1].append(r["model"])
    lines += ["", "## Refused norm classes", "", "| class | models | reason |", "|---|---|---|"]
    for kind, (reason, models) in sorted(reasons.items()):
        lines.append(f"| {kind} | {len(models)} | {reason.replace('|', '/')} |")
    grouped = defaultdict(list)
    for r in rows:
        grouped[r["outcome"]].append(r)
    lines += ["", "## Models", "", "| model | outcome | detail |", "|---|---|---|"]
    for r in rows:
        if r["outcome"] in ("exact", "inexact"):
            detail = f"gap {r['gap']:.1e}; " + ", ".join(
                f"{v}× {k}" for k, v in r["converted"].items()
            )
        elif r["outcome"] == "refused":
            detail = f"{', '.join(sorted(r['refused']))}; skip_unsupported=True: gap {r['shared']}"
        else:
            detail = r.get("why", "")
        lines.append(f"| {r['model']} | {r['outcome']} | {detail} |")
    return "\n".join(lines)


def main() -> None:
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated substrings of class names to run")
    parser.add_argument("--output", help="also write the Markdown summary to this file")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    names = sorted(
        n for n in dir(transformers) if n.endswith(HEADS) and not n.startswith(("Auto", "TF"))
    )
    if args.only:
        names = [n for n in names if any(s in n for s in args.only.split(","))]
    started = time.perf_counter()
    rows = []
    for name in names:
        row = sweep_one(name)
        rows.append(row)
        print(f"{name}: {row['outcome']} {row.get('gap', row.get('why', ''))}", flush=True)
        if row["outcome"] == "failed":
            print(row["trace"], flush=True)
    text = report(rows, time.perf_counter() - started)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as file:
            file.write(text + "\n")


if __name__ == "__main__":
    main()
