"""Training a σN-Ens ensemble with the frameworks users already have.

Each integration imports its framework only when its module is imported:
:mod:`~snens.integrations.huggingface` (``SnensTrainer``, ``pip install 'snens[huggingface]'``),
:mod:`~snens.integrations.lightning` (``SnensModule``, ``pip install 'snens[lightning]'``) and
:mod:`~snens.integrations.peft` (saving and loading PEFT adapters, ``pip install 'snens[llm]'``).
"""

__all__: list[str] = []
