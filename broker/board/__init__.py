"""Board reports (SPEC S5): pure rendering here; delivery and reconciliation live beside it."""
