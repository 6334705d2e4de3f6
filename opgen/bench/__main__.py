"""`python -m opgen.bench [options]`: the same as `opgen bench`."""
import sys

from opgen.cli.bench import main

if __name__ == "__main__":
    sys.exit(main())
