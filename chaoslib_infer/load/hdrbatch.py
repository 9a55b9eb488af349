"""HDR histograms fed in vectorised batches: one ``record_value(value, count)`` per distinct
bucket instead of one call per value (a million values in well under a second, not tens).

Percentiles of an HDR histogram depend only on its bucket counts, so recording each value's
bucket once with its count gives the same histogram as recording every value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

__all__ = ["bucket_counts", "record_many"]


def bucket_counts(h: HdrHistogram, values: np.ndarray[Any, Any]) -> tuple[list[int], list[int]]:
    """``(lowest values, counts)`` of the buckets of ``h`` that ``values`` fall in.

    Args:
        h: the histogram whose bucket layout applies (``lowest_trackable_value`` 1, so
            ``unit_magnitude`` 0: a value of bit length ``b`` keeps its top
            ``sub_bucket_half_count_magnitude + 1`` bits).
        values: positive integers inside ``h``'s range (int64 array; the caller clamps).

    Returns:
        Two lists of equal length, sorted by value; an empty input gives two empty lists.
    """
    us = np.asarray(values, dtype=np.int64)
    if not us.size:
        return [], []
    _, bits = np.frexp(us.astype(np.float64))  # us = m * 2**bits with 0.5 <= m < 1: bit length
    keep = h.sub_bucket_half_count_magnitude + 1
    shift = np.maximum(bits.astype(np.int64) - keep, 0)
    low = (us >> shift) << shift
    vals, counts = np.unique(low, return_counts=True)
    return vals.tolist(), counts.tolist()


def record_many(h: HdrHistogram, values: np.ndarray[Any, Any]) -> None:
    """Record every value of ``values`` (as :func:`bucket_counts` takes them) into ``h``; the
    same histogram as ``h.record_value(v)`` for each."""
    for value, count in zip(*bucket_counts(h, values), strict=True):
        h.record_value(value, count)
