"""The grading side of each topic: ``check_*`` functions, named mistakes and reference answers.

Kept apart from the lesson library (``course_utils.<topic>``) so that no problem-set answer sits in a
module the lessons import. Problem sets import ``from course_utils.grading import <topic>``.
"""
