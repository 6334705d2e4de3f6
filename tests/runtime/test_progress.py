"""The progress line (runtime/progress.py): redrawn in place on a terminal,
milestones only on a pipe."""
import io

from opgen.runtime.progress import Progress


def test_progress_line():
    tty = io.StringIO()
    tty.isatty = lambda: True
    p = Progress(True, tty)
    p.show("compile [####] 4/4", milestone=True)
    p.show("tune x", milestone=True)
    p.end()
    assert tty.getvalue() == "\rcompile [####] 4/4\rtune x            \n"
    pipe = io.StringIO()
    p = Progress(True, pipe)
    p.show("not a milestone")
    p.show("done", milestone=True)
    assert pipe.getvalue() == "done\n"
    assert Progress.bar(1, 4, 8) == "[##------]"
