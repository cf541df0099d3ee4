"""snens.engine.memory: the peak memory an epoch record carries."""

import mmap
import sys

import pytest
import torch

from snens.engine import memory
from snens.engine.memory import PeakMemory, peak_over

linux = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")


@linux
def _touch_fresh_pages(size: int) -> None:
    """Map ``size`` bytes of new anonymous memory, write every page, unmap it. (A tensor would
    come from the allocator, which may serve it from memory an earlier test left resident:
    then nothing new is resident, as a long-lived test worker showed.)"""
    block = mmap.mmap(-1, size)
    for offset in range(0, size, mmap.PAGESIZE):
        block[offset] = 1
    block.close()


def test_the_resident_peak_covers_an_allocation_inside_the_block_and_restarts_after_it():
    with PeakMemory(torch.device("cpu")) as peak:
        _touch_fresh_pages(256 * 2**20)
    inside = peak.record()["peak_rss_mib"]
    with PeakMemory(torch.device("cpu")) as peak:
        pass
    after = peak.record()["peak_rss_mib"]
    assert inside - after > 200  # the earlier block's peak is not carried into the next


def test_a_platform_without_the_resident_peak_leaves_it_out(monkeypatch, tmp_path):
    monkeypatch.setattr(memory, "_STATUS", tmp_path / "missing")
    with PeakMemory(torch.device("cpu")) as peak:
        torch.ones(10)
    assert peak.record() == {}


@linux
def test_a_kernel_that_refuses_the_reset_leaves_the_resident_peak_out(monkeypatch, tmp_path):
    """The lifetime peak would be another measure under the same name: not reported."""
    monkeypatch.setattr(memory, "_CLEAR_REFS", tmp_path / "no" / "clear_refs")
    with PeakMemory(torch.device("cpu")) as peak:
        torch.ones(10)
    assert peak.record() == {}


def test_the_run_peak_is_the_largest_epoch_peak_of_each_measure():
    records = [
        {"epoch": 1, "peak_rss_mib": 900.0},
        {"epoch": 2, "peak_rss_mib": 1200.5, "peak_cuda_mib": 30.0},
        {"epoch": 3},
    ]
    assert peak_over(records) == {"peak_rss_mib": 1200.5, "peak_cuda_mib": 30.0}
    assert peak_over([]) == {}
