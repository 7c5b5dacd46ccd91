"""`python -m loadtest`: see loadtest/driver.py."""

import sys

from loadtest.driver import main

sys.exit(main())
