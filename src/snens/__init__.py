"""snens: σN-Ens, sigma-Norm implicit ensembles with temperature-controlled diversity."""

__version__ = "0.1.0"
