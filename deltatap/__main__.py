"""``python -m deltatap`` is the ``deltatap`` console script."""

import sys

from deltatap.app import main

sys.exit(main())
