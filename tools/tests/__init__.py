"""Tests of the Python tools in tools/ (run: python3 -m unittest discover -s tools/tests -v)."""
