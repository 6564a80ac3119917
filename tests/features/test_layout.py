"""features/ by concept: the offline build (training, statistics, quality, saving) never imports
the page's views, so a build runs, and is changed, without them."""
import ast
from pathlib import Path

import bertdemo.features

FEATURES = Path(bertdemo.features.__file__).parent
BUILD = ["making.py", "stats.py", "effects.py", "quality.py", "training.py", "data.py", "dictionary.py", "store.py"]
VIEWS = {"views", "labels", "quality_views", "search", "feature_map", "drift", "senses"}


def imported_modules(path: Path) -> set[str]:
    """The package modules `path` imports from (`from .views import x` -> "views"), its functions' imports included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {alias.name for alias in node.names}
    return found


def test_the_build_imports_none_of_the_pages_views():
    for name in BUILD:
        reached = imported_modules(FEATURES / name) & VIEWS
        assert not reached, f"features/{name} imports the page's views {sorted(reached)}"


def test_the_check_sees_an_import_of_a_view(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from .views import promoted_ids\n")
    assert imported_modules(module) == {"views"}
