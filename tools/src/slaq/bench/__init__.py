"""Benchmarks and the trace-driven simulator that judge slaq against stock vLLM."""
