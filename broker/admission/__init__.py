"""Admission control (SPEC S4.1): one line in arrival order and a limit on live Hermes runs."""
