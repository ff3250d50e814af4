"""`python -m broker.demo`: the whole story in one terminal (SPEC S7)."""
