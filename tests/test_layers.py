"""The layers of docs/architecture.md, checked on the source: every import between the top-level parts of
picpeak_lite points down, so no import circle between packages can come back.

The imports are read with ast from the files themselves (nothing is imported), including imports inside
functions and ``if TYPE_CHECKING:`` blocks: a type-only arrow up is still a dependency the other way.
"""

from __future__ import annotations

import ast
from pathlib import Path

import picpeak_lite

PACKAGE_DIR = Path(picpeak_lite.__file__).parent

# Each top-level module or package of picpeak_lite and its layer: an import must go to a strictly lower layer.
# Parts on the same layer (web and ops, store and media) may not import each other either.
LAYERS: dict[str, int] = {
    "__main__": 12,
    "cli": 11,
    "server": 10,
    "supervisor": 10,
    "web": 9,
    "ops": 9,
    "pipeline": 8,
    "events": 7,
    "domain": 6,
    "services": 5,
    "runtime": 4,
    "store": 3,
    "media": 3,
    "security": 3,
    "totp": 3,
    "config": 2,
    "errors": 1,
    "i18n": 0,
    "targets": 0,
    "perrun": 0,
    "resources": 0,
}


def part_of(module: str) -> str | None:
    """The top-level part of picpeak_lite a dotted module name is in (None: another distribution's)."""
    parts = module.split(".")
    if parts[0] != "picpeak_lite" or len(parts) < 2:
        return None
    return parts[1]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path, root: Path) -> list[str]:
    """Every module the file names in an import, relative imports resolved against its own package. For
    ``from package import name`` both ``package`` and ``package.name`` (which may be a module: ``from
    picpeak_lite import security``)."""
    name = module_name(path, root)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append(module)
            found.extend(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def arrows(root: Path) -> dict[tuple[str, str], list[str]]:
    """(from part, to part) -> the imports that make that arrow, for every pair of different parts."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        source = part_of(module_name(path, root))
        if source is None:
            continue
        for target_module in imported_modules(path, root):
            target = part_of(target_module)
            if target is not None and target != source:
                found.setdefault((source, target), []).append(f"{path.relative_to(root.parent)}: {target_module}")
    return found


def circles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected groups of more than one part (Tarjan), each sorted."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def layer_violations(root: Path) -> list[str]:
    found = arrows(root)
    unplaced = sorted({part for pair in found for part in pair} - set(LAYERS))
    wrong = [f"{a} (layer {LAYERS[a]}) imports {b} (layer {LAYERS[b]}): " + "; ".join(why[:3])
             for (a, b), why in sorted(found.items())
             if a in LAYERS and b in LAYERS and LAYERS[a] <= LAYERS[b]]
    return [f"{part} has no layer in tests/test_layers.py LAYERS" for part in unplaced] + wrong


def test_every_top_level_part_has_a_layer() -> None:
    parts = {path.stem if path.suffix == ".py" else path.name
             for path in PACKAGE_DIR.iterdir()
             if (path.suffix == ".py") or (path.is_dir() and (path / "__init__.py").is_file())}
    parts.discard("__init__")
    assert parts - set(LAYERS) == set(), "place each new top-level module or package in LAYERS"
    assert set(LAYERS) - parts == set(), "LAYERS names a part that is gone"


def test_imports_point_down_the_layers() -> None:
    assert layer_violations(PACKAGE_DIR) == []


def test_no_import_circle_between_packages() -> None:
    assert circles(set(arrows(PACKAGE_DIR))) == []


def test_the_checks_see_an_arrow_up_and_a_circle(tmp_path: Path) -> None:
    """The reader itself: a tree with a lower part importing a higher one (absolute, relative, inside a
    function) is reported, and its circle found."""
    root = tmp_path / "picpeak_lite"
    for folder in ("store", "web"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "web" / "app.py").write_text("from picpeak_lite.store import db\n")
    (root / "store" / "db.py").write_text("def f():\n    from ..web import app\n")
    (root / "store" / "other.py").write_text("import picpeak_lite.web.app\n")
    (root / "config.py").write_text("from picpeak_lite import web\n")
    found = arrows(root)
    assert found[("config", "web")] == ["picpeak_lite/config.py: picpeak_lite.web"]
    assert found[("store", "web")] == ["picpeak_lite/store/db.py: picpeak_lite.web",
                                       "picpeak_lite/store/db.py: picpeak_lite.web.app",
                                       "picpeak_lite/store/other.py: picpeak_lite.web.app"]
    assert found[("web", "store")] == ["picpeak_lite/web/app.py: picpeak_lite.store",
                                       "picpeak_lite/web/app.py: picpeak_lite.store.db"]
    assert circles(set(found)) == [["store", "web"]]
    assert [v.split(":")[0] for v in layer_violations(root)] == ["config (layer 2) imports web (layer 9)",
                                                                  "store (layer 3) imports web (layer 9)"]


# What only pipeline/photos.py (and the pipeline below it) may call: (module, function), "*" for all of a module's.
PHOTO_WORK = {
    ("picpeak_lite.pipeline.transitions", "*"),
    ("picpeak_lite.pipeline.moderation", "review"),
    ("picpeak_lite.store.queries.photos", "retry"),
    ("picpeak_lite.store.queries.photos", "delete"),
    ("picpeak_lite.store.queries.admin_photos", "set_hidden"),
    ("picpeak_lite.store.queries.admin_photos", "set_cover"),
}


def photo_work_in(path: Path) -> list[str]:
    """The calls of PHOTO_WORK in one file (through any import name), and removals of a photo's files."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bound: dict[str, str] = {}  # the name a module is known by in this file -> the module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    found = [f"{path.name}:{node.lineno} imports {node.module}.{alias.name}"
             for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             for alias in node.names
             if (node.module, alias.name) in PHOTO_WORK or (node.module, "*") in PHOTO_WORK]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr in ("remove_photo_files", "remove_files_of"):
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        elif isinstance(node.value, ast.Name) and node.value.id in bound:
            module = bound[node.value.id]
            if (module, "*") in PHOTO_WORK or (module, node.attr) in PHOTO_WORK:
                found.append(f"{path.name}:{node.lineno} {module}.{node.attr}")
    return found


def test_views_leave_photo_work_to_pipeline_photos() -> None:
    """Deleting, retrying, reviewing, hiding photos and choosing the cover run in pipeline/photos.py: no module
    under web/ changes a photo's state itself or removes a photo's files."""
    assert [hit for path in sorted((PACKAGE_DIR / "web").rglob("*.py")) for hit in photo_work_in(path)] == []


def test_views_do_not_import_each_other() -> None:
    """What views share is in web/views/common.py (docs/architecture.md); a view importing another is refused."""
    views = PACKAGE_DIR / "web" / "views"
    found = [f"{path.name} imports {module}"
             for path in sorted(views.glob("*.py"))
             for module in imported_modules(path, PACKAGE_DIR)
             if module.startswith("picpeak_lite.web.views.")
             and module.split(".")[3] not in ("common", path.stem)]
    assert found == []
