"""The method: σN-Ens itself.

* :mod:`~snens.method.ensemble` — the ensemble contract (:class:`snens.Ensemble`: (B, …) →
  logits (M, B, K)), the mean prediction, member extraction;
* :mod:`~snens.method.convert` — conversion of any model with norms (:func:`snens.convert`);
* :mod:`~snens.method.loss` — the ensemble loss (:func:`snens.ensemble_loss`);
* :mod:`~snens.method.export` — ``torch.export`` and ONNX (:func:`snens.export`);
* :mod:`~snens.method.regularizer` — the diversity regularizer and its temperature–sharing
  relation k*(τ);
* :mod:`~snens.method.allocation` — the realized sharing: importances and effective members
  per feature;
* :mod:`~snens.method.optim` — the optimizer's parameter groups (γ's own learning rate).

The member layers themselves are :mod:`snens.nn`. Dependency rule: the method imports
:mod:`snens.nn` and :mod:`snens.metrics`, never :mod:`snens.evaluation` or :mod:`snens.engine`
(``tests/test_layout.py`` keeps it).
"""
