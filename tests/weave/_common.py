"""Constants shared by the weave tier's tests."""

API_KEY = "test-key-0123456789abcdef"
PROJECT_ID = "ent/proj"
