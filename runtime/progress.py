"""One status line on stderr for long GPU runs (the tuner's compile and
timing progress): redrawn in place ('\\r') on a terminal; on a pipe only the
milestones are printed, one per line."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, enabled: bool, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._width = 0
        self._last = 0.0

    def show(self, text: str, milestone: bool = False) -> None:
        if not self.enabled:
            return
        if not self.tty:
            if milestone:
                print(text, file=self.stream, flush=True)
            return
        now = time.monotonic()
        if not milestone and now - self._last < 0.05:     # redraw at most 20x a second
            return
        self._last = now
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def log(self, text: str) -> None:
        """A line of its own (a note that must stay visible)."""
        if not self.enabled:
            return
        self.end()
        print(text, file=self.stream, flush=True)

    def end(self) -> None:
        if self.enabled and self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
        self._width = 0

    @staticmethod
    def bar(done: int, total: int, width: int = 20) -> str:
        k = width * done // max(total, 1)
        return "[" + "#" * k + "-" * (width - k) + "]"
