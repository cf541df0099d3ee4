"""Training a σN-Ens ensemble with the frameworks users already have.

Each integration lives in its own module and imports its framework only when that module is
imported, so ``import snens`` (and ``import snens.integrations``) needs neither:

* :mod:`snens.integrations.huggingface`: :class:`~snens.integrations.huggingface.SnensTrainer`,
  a ``transformers.Trainer`` (``pip install 'snens[huggingface]'``);
* :mod:`snens.integrations.lightning`: :class:`~snens.integrations.lightning.SnensModule`, a
  ``lightning.LightningModule`` (``pip install 'snens[lightning]'``);
* :mod:`snens.integrations.peft`: saving and loading a σN-Ens model over PEFT (LoRA)
  adapters — the adapters and the member layers, without the base model
  (``pip install 'snens[llm]'``).

The first two train on ``ensemble_loss + diversity_loss``, build the optimizer from
:func:`snens.param_groups` (γ in its own group at ``lr × gamma_lr_multiplier``), evaluate the
ensemble's mean prediction (:func:`snens.predictive_probs`), and log the task loss with the
diversity gain (:func:`snens.diversity_gain`) beside it.
"""

__all__: list[str] = []
