"""One alias per module (CONTRIBUTING.md, "One alias per module"): the checker and fixer, and the committed notebooks."""
from __future__ import annotations

import json

import nbformat
import pytest

from course_utils.devtools import aliases


def notebook(tmp_path, *sources, markdown="`at.online_softmax` in the text"):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(markdown), *(nbformat.v4.new_code_cell(s) for s in sources)]
    path = tmp_path / "lesson.ipynb"
    nbformat.write(nb, path)
    return path


def code(path):
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def test_the_fixer_rewrites_imports_and_uses_in_code_only(tmp_path):
    path = notebook(tmp_path,
                    "%matplotlib inline\nfrom course_utils import attention as at   # the library\nimport numpy as np",
                    "y = at.softmax(x)  # at.softmax in a comment\nprint(f\"{at.softmax(x)[0]:.3f}\", 'at.x in a string')\n"
                    "f(at)\nobj.at = 1")
    assert [f.new for f in aliases.find(path)] == ["attn"]
    aliases.fix_notebook(path)
    first, second = code(path)
    assert "from course_utils import attention as attn   # the library" in first and "%matplotlib inline" in first
    assert second == ("y = attn.softmax(x)  # at.softmax in a comment\nprint(f\"{attn.softmax(x)[0]:.3f}\", 'at.x in a string')\n"
                      "f(attn)\nobj.at = 1")
    assert "`at.online_softmax`" in nbformat.read(path, as_version=4).cells[0].source   # markdown untouched
    assert aliases.find(path) == []


def test_an_unaliased_import_gains_the_alias(tmp_path):
    path = notebook(tmp_path, "from course_utils import convolution_blocking\nb = convolution_blocking.cache_sizes()")
    aliases.fix_notebook(path)
    assert code(path) == ["from course_utils import convolution_blocking as cv_blocking\nb = cv_blocking.cache_sizes()"]


def test_the_fixer_refuses_a_name_already_taken(tmp_path):
    path = notebook(tmp_path, "from course_utils import attention as at\nattn = 3\nat.softmax(attn)")
    with pytest.raises(ValueError, match="already names something else"):
        aliases.fix_notebook(path)


def test_grading_modules_are_imported_as_grading(tmp_path):
    path = notebook(tmp_path, "from course_utils.grading import gemm as GG\nGG.check_linear(f)")
    aliases.fix_notebook(path)
    assert code(path) == ["from course_utils.grading import gemm as grading\ngrading.check_linear(f)"]


def test_every_committed_notebook_uses_the_one_alias_per_module():
    found = aliases.check()
    assert not found, [f"{f.notebook}: {f.module} as {f.old} (use {f.new})" for f in found]
