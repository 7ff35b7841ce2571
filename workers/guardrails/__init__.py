"""A worker's quality guardrails: the canary gate and shadow comparison."""
