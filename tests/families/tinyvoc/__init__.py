"""TinyVoc: a tiny vocoder-only model family that lives in the tests (tests/test_fourth_family.py)."""
