"""Old import paths of modules that moved into :mod:`course_utils.classroom` and :mod:`course_utils.devtools`.

``course_utils/__init__.py`` appends this folder to the package's ``__path__``, so ``import course_utils.grader``
finds ``_shims/grader.py``, which makes that name the moved module itself (``course_utils.grader is
course_utils.classroom.grader``): learners' notebooks and scripts written before the move keep working, without
a warning, and a monkeypatch through the old name patches the real module. New code uses the new paths; a test
checks that no committed notebook imports through a shim. The folder is not a copy of the old files, so that
git follows each moved file to its new home.
"""
