"""The command line's argument parser: usage mistakes end as one line, like every other bad input."""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes end as one line ``fastar: error: ...`` with exit code 2, like every other bad input."""

    def error(self, message):
        hint = f" (see {self.prog} --help)"
        self.exit(2, f"fastar: error: {message}{hint}\n")
