"""The classroom: checking exercises, generating them, grading notebooks and classes.

Never imported by a lesson or a topic module (the tests check it); the lesson-facing runtime
(:mod:`course_utils.checks`, :mod:`course_utils.env`, ...) sits below it and never imports it.

* :mod:`~course_utils.classroom.checking` -- ``check_function``/``check_value``/``Mistake``/``call_learner``:
  the machinery every ``course_utils.grading.<topic>`` check is built from
* :mod:`~course_utils.classroom.forbidden` -- catching calls of the functions an exercise asks to write by hand
* :mod:`~course_utils.classroom.assignments` -- ``solutions/`` -> ``exercises/`` and the drift check
* :mod:`~course_utils.classroom.grader`, :mod:`~course_utils.classroom.pristine`, :mod:`~course_utils.classroom.remote`
  -- grading one notebook: pristine checks in the grading process, the learner's code remote in its kernel
* :mod:`~course_utils.classroom.gradebook` -- grading a class folder into a gradebook
* :mod:`~course_utils.classroom.release`, :mod:`~course_utils.classroom.bank` -- the learners' release and its
  banked self-checks; :mod:`~course_utils.classroom.released` -- the checks' callable inputs and drivers, which ship

Importing this package imports none of its modules (the learner's kernel imports only ``remote``).
"""
__all__: list[str] = []
