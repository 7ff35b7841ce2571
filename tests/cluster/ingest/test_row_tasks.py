"""Ray Data's row functions: repeated ids marked, and a module that starts a Ray worker without torch."""
import subprocess
import sys

import pyarrow as pa

from cluster.ingest.row_tasks import mark_repeats


def test_repeated_ids_get_their_problem_and_other_rows_keep_theirs() -> None:
    batch = pa.table({"file": ["f", "f", "g"], "row": [1, 2, 1], "problem": ["", "", "has no text"]})
    marked = mark_repeats(batch, {("f", 2): "id 'a' is already used by f row 1"})
    assert marked["problem"].to_pylist() == ["", "id 'a' is already used by f row 1", "has no text"]
    assert mark_repeats(batch, {}) is batch


def test_the_row_tasks_module_imports_no_torch() -> None:
    check = "import sys, cluster.ingest.row_tasks; assert 'torch' not in sys.modules, 'torch imported'"
    finished = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
