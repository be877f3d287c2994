"""The doctor command reports every package, the tier and a working Triton."""
from __future__ import annotations

import io

from course_utils.devtools.doctor import PACKAGES, run_doctor


def test_doctor_reports_ok_for_the_installed_environment():
    out = io.StringIO()
    assert run_doctor(out) == 0, out.getvalue()
    text = out.getvalue()
    for _module, dist, _required in PACKAGES:
        assert dist in text
    assert "tier" in text and "all good" in text


def test_doctor_flags_a_missing_package(monkeypatch):
    import course_utils.devtools.doctor as doctor

    monkeypatch.setattr(doctor, "PACKAGES", [("definitely_not_a_package_xyz", "xyz", True)])
    out = io.StringIO()
    assert doctor.run_doctor(out) == 1
    assert "FAIL  xyz" in out.getvalue()
