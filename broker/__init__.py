"""hermes-bridge-runs: a durable job broker in front of the Hermes /v1/runs API."""
