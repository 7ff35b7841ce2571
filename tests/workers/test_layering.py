"""Which parts of workers/ may import which: the evaluation is a leaf, the engine interface names no engine part."""
import ast
from pathlib import Path

WORKERS = Path(__file__).resolve().parents[2] / "workers"


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at top level or inside a block (TYPE_CHECKING included)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def test_nothing_in_workers_outside_the_evaluation_imports_it() -> None:
    importers = [
        str(path.relative_to(WORKERS))
        for path in WORKERS.rglob("*.py")
        if "evaluation" not in path.relative_to(WORKERS).parts
        and any(name.split(".")[:2] == ["workers", "evaluation"] for name in imported_modules(path))
    ]
    assert importers == []


def test_the_engine_interface_does_not_import_the_fuser() -> None:
    assert not {name for name in imported_modules(WORKERS / "engines" / "base.py") if name.startswith("workers.fuser")}
