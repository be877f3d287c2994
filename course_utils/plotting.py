"""One figure style for the whole course, applied by :func:`course_utils.setup`.

Every lesson's figures use these colours and sizes so that rungs of a ladder keep the same colour
from plot to plot. Figures render as PNG (nbval skips PNG, so plots never break the compare).
"""
from __future__ import annotations

import matplotlib

__all__ = ["COLORS", "CYCLE", "STYLE", "apply_style", "color_for"]

# Colour per kind of rung, reused by bench.plot_ladder and every lesson.
COLORS = {
    "loops": "#d62728",  # naive Python/NumPy loops
    "numpy": "#ff7f0e",  # vectorized NumPy
    "torch": "#1f77b4",  # PyTorch / production reference
    "triton": "#2ca02c",  # Triton kernels
    "reference": "#7f7f7f",  # ceilings, references, guides
}
CYCLE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]

STYLE = {
    "figure.figsize": (7.0, 4.0),
    "figure.dpi": 90,
    "savefig.dpi": 110,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "axes.prop_cycle": matplotlib.cycler(color=CYCLE),
    "figure.constrained_layout.use": True,
}


def apply_style() -> None:
    """Set the course's matplotlib rcParams and make inline figures PNG."""
    matplotlib.rcParams.update(STYLE)
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("png")
    except Exception:  # not in IPython: nothing to configure
        pass


def color_for(label: str) -> str:
    """The course colour for a rung label: looks for loops/numpy/torch/triton in it."""
    low = label.lower()
    if "loop" in low:  # "numpy loops" is a loop rung
        return COLORS["loops"]
    for key in ("triton", "torch", "numpy", "reference"):
        if key in low:
            return COLORS[key]
    if "python" in low:
        return COLORS["loops"]
    return COLORS["reference"]
