"""Load tests against a running server: the traffic, what each answer is checked
against, malformed requests, and the job that travels to .venv-triton."""
