"""Evaluation harness, pass@k, reports and the trace viewer."""
