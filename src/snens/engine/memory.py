"""Peak memory over a stretch of training, as :func:`~snens.engine.train.train` logs it per epoch:
``peak_rss_mib``, the process's peak resident set (Linux: ``VmHWM``, reset through
``/proc/self/clear_refs``), and ``peak_cuda_mib``, the peak tensor memory on the run's GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _resident_peak_kib() -> int | None:
    """``VmHWM`` in KiB, or None where there is none."""
    try:
        status = _STATUS.read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def _reset_resident_peak() -> bool:
    """Restart ``VmHWM`` at the current resident set; False where the kernel does not allow it."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` measures the block's peak memory, in MiB, for
    ``peak.record()``; a measure the platform cannot give is left out."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._resident = False
        self._measured: dict[str, float] = {}

    def __enter__(self) -> PeakMemory:
        self._measured = {}
        self._resident = _resident_peak_kib() is not None and _reset_resident_peak()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        kib = _resident_peak_kib() if self._resident else None
        if kib is not None:
            self._measured["peak_rss_mib"] = kib / 1024
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._measured["peak_cuda_mib"] = torch.cuda.max_memory_allocated(self.device) / 2**20

    def record(self) -> dict[str, Any]:
        """The measures taken by the last ``with`` block."""
        return dict(self._measured)


def peak_over(records: list[dict[str, Any]]) -> dict[str, float]:
    """The largest of each peak measure over epoch records (metrics.jsonl): the run's peak."""
    peaks: dict[str, float] = {}
    for record in records:
        for key in ("peak_rss_mib", "peak_cuda_mib"):
            if key in record:
                peaks[key] = max(peaks.get(key, 0.0), float(record[key]))
    return peaks
