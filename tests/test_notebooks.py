"""Every teaching notebook runs top to bottom in a fresh kernel (nbclient), and fails on any error: their own
assertions check what they teach (hits counted, answers equal to the explicit-mask oracle, ...). They are
committed without outputs."""

import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="./scripts/setup.sh installs nbformat, nbclient and ipykernel")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "examples" / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300


def test_the_notebooks_are_all_here_and_committed_without_outputs():
    assert [p.stem for p in NOTEBOOKS] == [
        "00_quickstart",
        "01_blocks_and_hashes",
        "02_spans_and_recipes",
        "03_scheduling",
        "04_sparse_checkpoints",
        "05_hybrid_resume",
        "06_rope_inside_attention",
    ]
    for path in NOTEBOOKS:
        cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in cells), f"{path.name} has outputs"
        # NOTE: the file as committed (nbformat.read fills missing ids in, and warns: a hard error to come)
        stored = json.loads(path.read_text())["cells"]
        assert all("id" in c for c in stored), f"{path.name} has cells without an id: nbformat.write it once"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path):
    notebook = nbformat.read(path, as_version=4)
    # NOTE: run from the repository root, so that `import ui` finds the app's package as it does for a reader.
    client = nbclient.NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute()  # raises CellExecutionError, with the failing cell and its traceback, on any error
    # NOTE: without ipywidgets (the set-up installs it) tqdm's first bar in a notebook prints "TqdmWarning: IProgress
    # not found" to stderr, in the reader's first cell
    stderr = [out.text for cell in notebook.cells for out in cell.get("outputs", []) if out.get("name") == "stderr"]
    assert not any("TqdmWarning" in text for text in stderr), stderr
