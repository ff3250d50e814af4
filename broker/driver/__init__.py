"""Turning stored jobs into Hermes runs: pure decisions, the job service, runners, the supervisor."""
