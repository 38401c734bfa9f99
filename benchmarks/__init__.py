"""Benchmarks: each prints a table, writes JSON to benchmarks/results/, and reports ratios
against a baseline measured in the same run (these machines are noisy; absolute numbers are not
comparable across runs)."""
