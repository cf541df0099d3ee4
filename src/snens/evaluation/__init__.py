"""Evaluation: what a trained ensemble is worth.

* :mod:`~snens.evaluation.protocol` — the evaluation protocol (:func:`snens.evaluate`: accuracy,
  NLL, calibration, OOD detection, corruptions), :func:`~snens.evaluation.protocol.collect`
  of member probabilities or logits over a data set, and
  :func:`~snens.evaluation.protocol.posthoc_metrics` from the kept logits;
* :mod:`~snens.evaluation.calibration` — post-hoc calibrators fitted on a validation split
  (temperature, vector and matrix scaling, histogram binning) behind
  :func:`~snens.evaluation.calibration.fit_calibrator`;
* :mod:`~snens.evaluation.conformal` — split conformal prediction sets (THR, APS, RAPS) and
  their coverage and size;
* :mod:`~snens.evaluation.plots` — reliability diagrams, allocation heatmaps, frontiers.

The metrics, pure functions over tensors, are :mod:`snens.metrics`. Dependency rule: evaluation
imports the method, :mod:`snens.nn` and :mod:`snens.metrics`, never :mod:`snens.engine`
(``tests/test_layout.py`` keeps it).
"""
