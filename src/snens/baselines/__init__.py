"""Baselines under the (B, …) -> (M, B, K) contract."""

from snens.baselines.single import SingleModel

__all__ = ["SingleModel"]
