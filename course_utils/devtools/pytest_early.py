"""A pytest plugin the test command loads first (``-p course_utils.devtools.pytest_early`` in pyproject's addopts).

It keeps jsonschema from building its optional IRI grammar (``rfc3987_syntax``, a Lark parser: about 2 s of CPU)
when nbval's plugin imports nbformat, in the test process and in each of pytest-xdist's workers, which all load
plugins before any conftest. No notebook schema uses that format; jsonschema imports the grammar under
``suppress(ImportError)``, so a ``None`` entry reads as "not installed". The course's command line does the same
(``course_utils.__main__``). Nothing else imports this module.
"""
from __future__ import annotations

import sys

__all__: list[str] = []

if "jsonschema" not in sys.modules:
    sys.modules.setdefault("rfc3987_syntax", None)
