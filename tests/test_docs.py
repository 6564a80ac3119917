"""The README and docs/ say what the code is: every `bertdemo.x` name and file path they name
exists, their links land, the module maps equal the tree, no two modules import each other (the
layers run one way), the configuration page is the one generated from `Settings`, and the
README's first screen installs, runs and tests."""
import ast
import importlib
import re
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest

from bertdemo import config

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
EXTENSIONS = {"py", "md", "json", "txt", "tsv", "csv", "html", "onnx", "zip", "yaml", "yml", "conf",
              "sh", "png", "svg", "safetensors", "bin", "js", "css"}
# A bertdemo name: `bertdemo.fill_mask`, `bertdemo.config.Settings` (not a file such as .../bertdemo.conf).
FULL_NAME = re.compile(r"(?<![\w/.-])bertdemo(?:\.[A-Za-z_]\w*)+")
# A file or folder of this repository, named from its root.
PATH = re.compile(r"(?<![\w/.~$-])((?:\.ci|assets|bench|bertdemo|deploy|docs|tests)/[\w.*/-]*"
                  r"|app\.py|Dockerfile|requirements(?:-dev)?\.txt|pytest\.ini)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def inline_code(page: Path) -> list[str]:
    """The `code spans` of a page, outside its fenced blocks."""
    prose = re.sub(r"```.*?```", "", text(page), flags=re.S)
    return re.findall(r"`([^`\n]+)`", prose)


def resolve(name: str):
    """`bertdemo.a.b.c`: the longest importable module prefix, then attributes; AttributeError or
    ImportError when any part is missing."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            found = getattr(found, attr)
        return found
    raise ImportError(name)


def submodules() -> dict[str, str]:
    """Short module names (`loading`, `live_run`) -> their full names, for `loading.x` in code spans."""
    found = {}
    for path in sorted((ROOT / "bertdemo").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if not path.stem.startswith("_") and "templates" not in parts:
            found.setdefault(path.stem, ".".join(parts))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_bertdemo_name_the_page_gives_exists(page):
    names = set(FULL_NAME.findall(text(page)))
    for module, imported in re.findall(r"from (bertdemo[\w.]*) import ([\w, ]+)", text(page)):
        names |= {f"{module}.{name.strip()}" for name in imported.split(",") if name.strip()}
    short = submodules()
    for span in inline_code(page):  # `models.warm_up`, `memory.pages_kept`: a module of bertdemo's
        for module, attr in re.findall(r"(?<![\w/.-])([a-z_]+)\.([A-Za-z_]\w*)", span):
            if module in short and attr not in EXTENSIONS:
                names.add(f"{short[module]}.{attr}")
    missing = []
    for name in sorted(names):
        try:
            resolve(name)
        except (AttributeError, ImportError):
            missing.append(name)
    assert not missing, f"{page.name} names what the code does not have: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_file_the_page_names_exists(page):
    paths = {match.rstrip(".,;:") for match in PATH.findall(text(page))}
    missing = [p for p in sorted(paths) if not (any(ROOT.glob(p)) if "*" in p else (ROOT / p).exists())]
    assert not missing, f"{page.name} names files that are not in the repository: {missing}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose = re.sub(r"```.*?```", "", text(page), flags=re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", prose, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_lands(page):
    broken = []
    for target in LINK.findall(text(page)):
        if re.match(r"[a-z]+:", target):
            continue  # the web: not checked here (no network)
        file, _, anchor = target.partition("#")
        landing = (page.parent / file).resolve() if file else page
        if not landing.exists() or (anchor and landing.suffix == ".md" and anchor not in anchors(landing)):
            broken.append(target)
    assert not broken, f"{page.name} links to what is not there: {broken}"


def code_block_after(page: Path, heading: str) -> list[str]:
    body = text(page).split(heading, 1)[1]
    return re.search(r"```\n(.*?)```", body, re.S).group(1).splitlines()


def test_the_architecture_module_list_is_the_tree():
    listed, folders = set(), []
    for line in code_block_after(ROOT / "docs" / "architecture.md", "## The modules"):
        indent = (len(line) - len(line.lstrip())) // 2
        first = line.split()[0] if line.strip() else ""
        if first.endswith("/") and indent <= len(folders):
            folders[indent:] = [first]
        elif first.endswith(".py") and indent <= len(folders):
            listed.add("".join(folders[:indent]) + first)
    tree = {"app.py"} | {p.relative_to(ROOT).as_posix() for p in (ROOT / "bertdemo").rglob("*.py")}
    assert listed == tree, (f"docs/architecture.md lacks {sorted(tree - listed)}, "
                            f"and lists {sorted(listed - tree)} that are not there")


KNOWN_CIRCLES: set = set()  # import circles known and not cut yet (none)


def module_imports() -> dict[str, set[str]]:
    """{bertdemo module: the bertdemo modules it imports}, at the top, inside a function or for
    type checking alike: each is a dependency of the module's meaning."""
    paths = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (ROOT / "bertdemo").rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: `from ..training import loop`
                    base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names}
        graph[name] = (found & paths.keys()) - {name}
    return graph


def test_no_two_modules_import_each_other():
    graph = module_imports()
    reach = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            new = graph[todo.pop()] - seen
            seen |= new
            todo += new
        reach[start] = seen
    circles = {frozenset(m for m in reach[start] if start in reach[m])
               for start in graph if start in reach[start]}
    assert circles == KNOWN_CIRCLES, (
        f"modules that import each other (directly or around a circle): "
        f"{[sorted(c) for c in circles - KNOWN_CIRCLES]}; move what they share below them. "
        f"Cut since (drop from KNOWN_CIRCLES): {[sorted(c) for c in KNOWN_CIRCLES - circles]}")


def test_the_readme_code_map_is_the_top_of_the_tree():
    try:
        tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    folders = {path.split("/")[0] for path in tracked if "/" in path} | {"docs"}
    entries = [line.split()[0] for line in code_block_after(README, "## The code") if line[:1].strip()]
    shown = {entry.split("/")[0] for entry in entries}
    assert folders <= shown, f"README's map of the code lacks {sorted(folders - shown)}"
    assert all((ROOT / entry).exists() for entry in entries), entries


def test_the_configuration_page_is_generated_from_settings():
    committed = text(ROOT / "docs" / "configuration.md")
    assert committed == config.config_doc(), \
        "docs/configuration.md is stale: python -m bertdemo config-doc > docs/configuration.md"
    for f in fields(config.Settings):
        assert f"`{config.flag(f)}`" in committed and f"`{config.env_var(f)}`" in committed


def test_every_bertdemo_variable_the_code_reads_is_documented():
    code = [ROOT / "app.py", *(ROOT / "bertdemo").rglob("*.py")]
    read = {name for path in code for name in re.findall(r"\bBERTDEMO_[A-Z_]+[A-Z]", path.read_text())}
    documented = {config.env_var(f) for f in fields(config.Settings)} | set(config.OTHER_ENV)
    assert read - {config.ENV_PREFIX.rstrip("_")} <= documented, sorted(read - documented)


def test_the_readme_is_short_and_its_first_screen_installs_runs_and_tests():
    readme = text(README)
    assert len(readme.encode()) < 20_000
    first_screen = readme.split("## The tabs", 1)[0]
    for command in ["python3.11 -m venv", "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu",
                    "pip install -r requirements.txt", "python app.py", "http://127.0.0.1:7860",
                    "--model bundled", "docker build", "docker run", "pip install -r requirements-dev.txt",
                    'OMP_NUM_THREADS=1 python -m pytest -m "not slow and not browser" -q']:
        assert command in first_screen, command
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command == "python -m pytest -q" and f"\n{ci_command}\n" in first_screen  # CI runs the README's


def test_no_two_test_files_share_a_name():
    """pytest's default import mode imports each test file by its name alone: two files of one
    name in different folders (tests/views/test_heads.py, tests/circuits/test_heads.py) stop the run."""
    names = [path.name for path in (ROOT / "tests").rglob("test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def test_one_conftest_for_the_tests():
    """A second conftest.py (tests/x/conftest.py) is imported as the module `conftest` too: in a
    process that ran its folder first, `from conftest import launch` then finds that one."""
    assert [p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("conftest.py")] == ["tests/conftest.py"]
