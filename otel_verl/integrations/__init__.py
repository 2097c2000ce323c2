"""Integrations of otel_verl with the frameworks around a rollout: verl (instrumentor) and Ray."""
