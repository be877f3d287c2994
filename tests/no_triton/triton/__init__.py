"""A stand-in for a machine where the triton package is not installed (macOS, Windows, Arm Linux).

``make test-portable`` (course_utils.portable) puts this folder first on PYTHONPATH, so that
``import triton`` fails exactly as it does there.
"""
raise ImportError("No module named 'triton' (simulated by tests/no_triton: Triton installs only on Linux x86-64)")
