"""The training engine: a run from a config to its directory of evidence.

* :mod:`~snens.engine.config`, :mod:`~snens.engine.toml_io`, :mod:`~snens.engine.presets` —
  the typed run config, its TOML form, the named presets;
* :mod:`~snens.engine.train` (the loop, top to bottom), :mod:`~snens.engine.epoch` (one
  epoch), :mod:`~snens.engine.build` (what a config builds), :mod:`~snens.engine.fit` (the
  step for batches of one's own), :mod:`~snens.engine.datasets` (the data sets a config names);
* :mod:`~snens.engine.runs`, :mod:`~snens.engine.checkpoint`, :mod:`~snens.engine.reload` —
  run directories (locked with :mod:`snens.locks`), checkpoints, a run read back;
* :mod:`~snens.engine.sweep`, :mod:`~snens.engine.tune`, :mod:`~snens.engine.report` — grids
  of runs, a recipe chosen on a probe of its schedule, and their report;
* :mod:`~snens.engine.distributed` — data-parallel training under ``torchrun``;
* :mod:`~snens.engine.memory` — the peak memory each epoch record carries;
* :mod:`~snens.engine.cli`, :mod:`~snens.engine.demo`, :mod:`~snens.engine.bench` — the
  ``snens`` command, the demo, the measuring core of the cost measures (whose rows are the
  repository's ``benchmarks/harness.py``, which ``snens bench`` runs from a checkout).

Dependency rule: the engine imports the method, evaluation and the rest of the library; only
:mod:`snens.integrations` (training in other frameworks, a layer beside the engine) and the
``snens`` command import it (``tests/test_layout.py`` keeps it).
"""
