"""`python -m shardstream.demo rank …` runs one rank of the demo's job; without `rank`, the whole demo."""

import sys

from .rank import main
from .run import run_demo

if len(sys.argv) > 1 and sys.argv[1] == "rank":
    sys.exit(main(sys.argv[2:]))
sys.exit(run_demo())
