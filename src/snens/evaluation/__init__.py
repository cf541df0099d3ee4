"""Evaluation: what a trained ensemble is worth.

* :mod:`~snens.evaluation.protocol` — the evaluation protocol (:func:`snens.evaluate`: accuracy,
  NLL, calibration, OOD detection, corruptions), and :func:`~snens.evaluation.protocol.collect`
  of member probabilities or logits over a data set;
* :mod:`~snens.evaluation.calibration` — post-hoc temperature scaling;
* :mod:`~snens.evaluation.plots` — reliability diagrams, allocation heatmaps, frontiers.

The metrics, pure functions over tensors, are :mod:`snens.metrics`. Dependency rule: evaluation
imports the method, :mod:`snens.nn` and :mod:`snens.metrics`, never :mod:`snens.engine`
(``tests/test_layout.py`` keeps it).
"""
