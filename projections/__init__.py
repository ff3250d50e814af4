"""Pure folds over job events: no IO, no clock, no randomness."""
