# SPDX-License-Identifier: LGPL-2.1-or-later
"""Progress of a long run (the benchmark's modes, an example's modes and
steps): a line as each part starts and as it ends, so a run that takes
minutes on a small CPU is never silent. Where tqdm is installed and stderr
is a terminal the parts advance a bar (the lines still go to stdout, through
tqdm so the bar stays below them); otherwise the lines alone, which read the
same in a log."""
import sys
import time

try:
    import tqdm as _tqdm
except ImportError:
    _tqdm = None


class Progress:
    """``n`` parts of ``what``: :meth:`start` one, :meth:`end` it with a line
    (and a line as it starts, unless ``start_lines`` is False: short parts)."""

    def __init__(self, n, what="", bar=None, start_lines=True):
        self.n, self.i, self.what, self.start_lines = n, 0, what, start_lines
        if bar is None:
            bar = _tqdm is not None and sys.stderr.isatty()
        self._bar = _tqdm.tqdm(total=n, desc=what, leave=False, file=sys.stderr) if bar and _tqdm else None
        self._t0, self._name = None, ""

    def _line(self, text):
        if self._bar is not None:
            self._bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def start(self, name):
        """Part ``name`` begins: "[i/n] name: started"."""
        self.i += 1
        self._t0, self._name = time.perf_counter(), name
        if self._bar is not None:
            self._bar.set_description("%s%s" % (self.what + ": " if self.what else "", name))
        elif self.start_lines:
            self._line("[%d/%d] %s: started" % (self.i, self.n, name))

    def end(self, text=None):
        """The part ended: ``text`` (default "[i/n] name: done in S s") and the bar one further."""
        took = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
        self._line(text if text is not None else "[%d/%d] %s: done in %.1f s" % (self.i, self.n, self._name, took))
        if self._bar is not None:
            self._bar.update(1)

    def close(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
