"""Load test and benchmark drivers for shardstream: `python -m loadtest` (`make loadtest`) runs M
servers and N simulated ranks; `python -m loadtest.suite` (`make bench`) runs the benchmarks as ratios."""
