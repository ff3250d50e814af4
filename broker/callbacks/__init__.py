"""Job callbacks (SPEC S5.8): a create's own URL is told of each terminal state and approval request."""
