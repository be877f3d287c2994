"""Progress bars stable under nbval, and the figure style."""
from __future__ import annotations

import configparser
import re

import matplotlib

from course_utils.paths import ROOT
from course_utils import plotting
from course_utils.progress import progress


def sanitize(text: str) -> str:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "tests" / "nbval_sanitize.cfg")
    for section in cfg.sections():
        text = re.sub(cfg[section]["regex"], cfg[section].get("replace", ""), text)
    return text


def test_progress_output_has_no_rate_or_time_and_sanitizes_to_the_final_state(capsys):
    for _ in progress(range(50), desc="train", mininterval=0):
        pass
    raw = capsys.readouterr().out
    assert "\r" in raw and "it/s" not in raw and "<" not in raw
    assert sanitize(raw) == "train: 100%|####################| 50/50\n"


def test_sanitizer_hides_memory_addresses():
    assert sanitize("<function f at 0x7f3a2b4c5d6e>") == "<function f at 0xADDRESS>"


def test_style_is_applied_and_colors_are_stable():
    plotting.apply_style()
    assert matplotlib.rcParams["axes.grid"] is True
    assert plotting.color_for("Triton kernel") == plotting.COLORS["triton"]
    assert plotting.color_for("python loops") == plotting.COLORS["loops"]
    assert plotting.color_for("1 numpy loops") == plotting.COLORS["loops"]
    assert plotting.color_for("numpy tiles") == plotting.COLORS["numpy"]
    assert plotting.color_for("something else") == plotting.COLORS["reference"]
