"""The tests' shared assertion helpers live beside this file (tests/kernel_checks.py); pytest puts this
directory on sys.path for every test module, in tests/graph and tests/ops alike."""
