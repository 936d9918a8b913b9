"""Every script in ``benchmarks/`` and ``examples/`` imports: a name renamed in the library
breaks the script that uses it here, not months later on a user's machine. (The scripts'
own runs are the ``test_bench_*`` and example tests.)"""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_the_script_imports(path, monkeypatch):
    monkeypatch.syspath_prepend(str(path.parent))  # the scripts import their siblings
    spec = importlib.util.spec_from_file_location(f"_script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)  # top level only: each runs under `if __name__ == "__main__"`
