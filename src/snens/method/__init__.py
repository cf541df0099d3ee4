"""The method: σN-Ens itself.

The member layers themselves are :mod:`snens.nn`. The method imports :mod:`snens.nn` and
:mod:`snens.metrics`, never :mod:`snens.evaluation` or :mod:`snens.engine`.
"""
