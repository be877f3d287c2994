"""Old path of :mod:`course_utils.devtools.portable` (see :mod:`course_utils._shims`)."""
import importlib
import runpy
import sys

if __name__ == "__main__":  # python -m course_utils.portable
    runpy.run_module("course_utils.devtools.portable", run_name="__main__", alter_sys=True)
else:
    sys.modules[__name__] = importlib.import_module("course_utils.devtools.portable")
