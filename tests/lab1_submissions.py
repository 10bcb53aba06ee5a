"""Kept only for tests/test_autograder_integrity.py, which imports ROOT and page_text from here.

Both live in tests/lab_submissions.py, and Lab 1's known mistakes in tests/grading_specs.py
(LAB1). Delete this module once nothing imports it.
Not a test module (no `test_` prefix).
"""

from lab_submissions import ROOT, page_text

__all__ = ["ROOT", "page_text"]
