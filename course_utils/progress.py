"""Progress bars whose saved output is the same on every run (so nbval can compare it).

Used by every notebook with a loop that takes more than a second or two. The bar shows a
percentage, a bar and a count, never a rate or elapsed time. While it runs it refreshes in place
(with carriage returns); the repo's nbval sanitize file (``tests/nbval_sanitize.cfg``) keeps only
the final state of each line, which is deterministic.
"""
from __future__ import annotations

import sys
from typing import Iterable, Iterator, TypeVar

from tqdm import tqdm

__all__ = ["progress", "BAR_FORMAT"]

T = TypeVar("T")

BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar:20}| {n_fmt}/{total_fmt}"


def progress(iterable: Iterable[T] | None = None, desc: str = "progress", total: int | None = None, **kwargs) -> Iterator[T]:
    """``tqdm`` with a stable format, ASCII bar, printed to stdout.

    >>> for step in progress(range(3), desc="train"):
    ...     pass
    """
    options = dict(
        desc=desc,
        total=total,
        bar_format=BAR_FORMAT,
        ascii=True,
        file=sys.stdout,
        mininterval=0.5,
        dynamic_ncols=False,
        ncols=60,
        leave=True,
    )
    options.update(kwargs)
    return tqdm(iterable, **options)
