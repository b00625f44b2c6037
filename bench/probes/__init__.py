"""One-off probes behind earlier tuning decisions, kept re-runnable (python -m bench.probes.NAME); bench/README.md lists them."""
