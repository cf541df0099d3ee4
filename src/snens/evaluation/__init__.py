"""Evaluation: what a trained ensemble is worth.

* :mod:`~snens.evaluation.predictions` — :func:`~snens.evaluation.predictions.collect` of
  member probabilities or logits over a data set;
* :mod:`~snens.evaluation.calibration` — post-hoc calibrators fitted on a validation split
  (temperature, vector and matrix scaling, histogram binning) behind
  :func:`~snens.evaluation.calibration.fit_calibrator`;
* :mod:`~snens.evaluation.conformal` — split conformal prediction sets (THR, APS, RAPS) and
  their coverage and size;
* :mod:`~snens.evaluation.protocol` — the evaluation protocol (:func:`snens.evaluate`: accuracy,
  NLL, calibration, OOD detection, corruptions) and
  :func:`~snens.evaluation.protocol.posthoc_metrics` from the kept logits;
* :mod:`~snens.evaluation.bootstrap` — paired bootstrap intervals between two methods;
* :mod:`~snens.evaluation.plots` — reliability diagrams, allocation heatmaps, frontiers.

The modules import one way, each only those listed before it; evaluation never imports
:mod:`snens.engine`. The metrics themselves are :mod:`snens.metrics`.
"""
