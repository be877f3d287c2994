"""Tools for the course's maintainers and CI, never imported by a lesson or a topic module.

* :mod:`~course_utils.devtools.doctor` -- ``python -m course_utils doctor``: the installation check
* :mod:`~course_utils.devtools.notebook_times` -- ``python -m course_utils times``: recorded notebook times
* :mod:`~course_utils.devtools.portable` -- nbval under emulated CPUs and without Triton (``make test-portable``)
* :mod:`~course_utils.devtools.compile_matrix` -- every course kernel at its GPU configurations (the compile tests)
"""
__all__: list[str] = []
