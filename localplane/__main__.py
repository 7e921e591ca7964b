"""``python -m localplane`` — the same as ``shepherd plane``."""

import sys

from shepherd.cli.main import main

if __name__ == "__main__":
    sys.argv[1:1] = ["plane"]
    main()
