"""Apps, workloads, baselines and reports (never imported by the library itself)."""
