"""A subcommand of `opgen`: its name, one line of help, the options it adds
to its parser and what it runs (returning the exit status)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
