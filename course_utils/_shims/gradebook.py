"""Old path of :mod:`course_utils.classroom.gradebook` (see :mod:`course_utils._shims`)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("course_utils.classroom.gradebook")
