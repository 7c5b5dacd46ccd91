"""`python -m loadtest`: see loadtest/driver.py and loadtest/cli.py."""

import sys

from loadtest.cli import main

sys.exit(main())
