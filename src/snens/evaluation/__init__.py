"""Evaluation: what a trained ensemble is worth.

:mod:`~snens.evaluation.predictions` (``collect``), :mod:`~snens.evaluation.calibration`
(post-hoc calibrators), :mod:`~snens.evaluation.conformal` (split conformal prediction sets),
:mod:`~snens.evaluation.protocol` (:func:`snens.evaluate` and metrics from kept logits),
:mod:`~snens.evaluation.bootstrap` (paired intervals) and :mod:`~snens.evaluation.plots`; each
imports only those before it, none :mod:`snens.engine`.
"""
