"""Example specs of 8-bit activations with sub-byte weights and the int32
output (issue 29; docs/spec.md): YAML fixtures, read by path. Valid specs no
kernel family serves yet, so they are not shipped in specs/. (A package only
because every test subfolder is one: tests/test_mirror.py.)"""
