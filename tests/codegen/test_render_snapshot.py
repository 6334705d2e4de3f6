"""The CUDA that ships is what the snapshot says (render_snapshot.py): a
restructuring of codegen renders every kernel of the shipped DB and every
heuristic pick at the bench's M and shapes to the same source, less comments
and whitespace, with the same launch geometry and the same picks. (What
"less comments and whitespace" means: test_source_hash.py.)"""
import json

import render_snapshot


def test_rendered_kernels_match_the_snapshot():
    old = json.loads(render_snapshot.SNAPSHOT.read_text())
    diff = render_snapshot.differences(old, render_snapshot.snapshot())
    assert not diff, f"{len(diff)} differences, first: " + "\n".join(diff[:10])

