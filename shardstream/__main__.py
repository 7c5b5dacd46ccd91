import sys

from shardstream.cli import main

sys.exit(main())
