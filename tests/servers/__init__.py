"""Real servers the root tests run as workloads (tests/servers/pymodel: a multi-worker Python
model server under gunicorn)."""
