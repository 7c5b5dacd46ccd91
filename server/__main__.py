"""`python -m shardstream.server ...` is `shardstream serve ...`."""

import sys

from shardstream.cli import main

sys.exit(main(["serve", *sys.argv[1:]]))
