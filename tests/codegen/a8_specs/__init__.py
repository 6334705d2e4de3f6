"""Example specs of 8-bit activations with sub-byte weights (issue 29;
docs/spec.md) that no kernel family serves yet, so they are not shipped in
specs/: YAML fixtures, read by path (tests/a8_examples.py lists them with the
shipped ones). (A package only because every test subfolder is one:
tests/test_mirror.py.)"""
