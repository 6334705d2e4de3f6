"""`python -m opgen ...`"""
import sys

from opgen.cli import main

sys.exit(main())
