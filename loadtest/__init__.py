"""Load and benchmark drivers for shardstream (`make bench` runs `python -m loadtest.bench`)."""
