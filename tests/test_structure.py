"""The package's shape, read from its source (no import): imports flow one way with no circle,
no module takes another's private names, and modules and functions stay small.

Layers, lowest first; a module imports only from its own layer or those below:

1. the driver door and plain helpers: ``_errors``, ``_driver``, ``_checks``,
   ``_version``, ``_daemon`` (every thread aiogpu starts), ``_per_process``;
2. the wake engine: ``_wait`` (it knows events only as ``_wait.Recording``);
3. what holds a handle: ``_lifetime``, ``_foreign``, ``_device``;
4. ``_event``;
5. ``_stream``;
6. what is built on streams: ``_pool``, ``_pinned``, ``_transfer``, ``_hangs``.

``aiogpu/__init__.py`` re-exports and ``aiogpu.testing`` may import anything.
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass, field

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "aiogpu"

LAYERS = (
    (
        "aiogpu._errors",
        "aiogpu._driver",
        "aiogpu._checks",
        "aiogpu._version",
        "aiogpu._daemon",
        "aiogpu._per_process",
    ),
    ("aiogpu._wait",),
    ("aiogpu._lifetime", "aiogpu._foreign", "aiogpu._device"),
    ("aiogpu._event",),
    ("aiogpu._stream",),
    ("aiogpu._pool", "aiogpu._pinned", "aiogpu._transfer", "aiogpu._hangs"),
)
#: May import from every layer.
ABOVE_ALL = ("aiogpu", "aiogpu.testing")

#: Imports that run at first use, inside a function, and go up the layers: factories that make
#: what a higher layer defines (``Device.default_stream``, ``Device.create_stream``,
#: ``Device.create_event``). Each closes a circle at run time.
UPWARD_AT_FIRST_USE = {
    ("aiogpu._device", "aiogpu._stream"),
    ("aiogpu._device", "aiogpu._event"),
}

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50  # of body, the docstring left out


@dataclass
class Module:
    name: str
    path: pathlib.Path
    is_package: bool
    tree: ast.Module
    imports: list[tuple[ast.ImportFrom | ast.Import, bool]] = field(default_factory=list)  # (node, at run time)

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]

    @property
    def relative(self) -> str:
        return self.path.relative_to(PACKAGE).as_posix()


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _collect_imports(node: ast.AST, run_time: bool, found: list[tuple[ast.ImportFrom | ast.Import, bool]]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            found.append((child, run_time))
        elif isinstance(child, ast.If) and _is_type_checking(child):
            for statement in child.body:
                _collect_imports(ast.Module(body=[statement], type_ignores=[]), False, found)
            for statement in child.orelse:
                _collect_imports(ast.Module(body=[statement], type_ignores=[]), run_time, found)
        else:
            _collect_imports(child, run_time, found)


def _modules() -> dict[str, Module]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["aiogpu", *path.relative_to(PACKAGE).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        module = Module(".".join(parts), path, is_package, ast.parse(path.read_text(encoding="utf-8"), str(path)))
        _collect_imports(module.tree, True, module.imports)
        modules[module.name] = module
    return modules


MODULES = _modules()


def _targets(module: Module, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """``(module imported, name taken from it or None)`` for each name the import binds."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names if alias.name.split(".")[0] == "aiogpu"]
    if node.level:
        base = module.package.split(".")
        base = base[: len(base) - (node.level - 1)]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    if source.split(".")[0] != "aiogpu":
        return []
    found: list[tuple[str, str | None]] = []
    for alias in node.names:
        submodule = f"{source}.{alias.name}"
        found.append((submodule, None) if submodule in MODULES else (source, alias.name))
    return found


def _run_time_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for module in MODULES.values():
        for node, run_time in module.imports:
            for target, _ in _targets(module, node):
                if run_time and target in MODULES and target != module.name:
                    edges[module.name].add(target)
    return edges


def _layer(name: str) -> int | None:
    if name in ABOVE_ALL or any(name.startswith(f"{top}.") for top in ABOVE_ALL[1:]):
        return len(LAYERS)
    for index, members in enumerate(LAYERS):
        if any(name == member or name.startswith(f"{member}.") for member in members):
            return index
    return None


def test_every_module_has_a_layer() -> None:
    assert [name for name in MODULES if _layer(name) is None] == [], "add the new module to LAYERS"


def test_imports_that_run_make_no_circle() -> None:
    edges = _run_time_edges()
    for source, target in UPWARD_AT_FIRST_USE:
        edges[source].discard(target)
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(edges[name]):
            if state.get(target) == 1:
                circle = [*path[path.index(target) :], target]
                pytest.fail("import circle: " + " -> ".join(circle))
            if target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name)


def test_the_allowed_upward_imports_are_still_made() -> None:
    edges = _run_time_edges()
    assert {(source, target) for source, target in UPWARD_AT_FIRST_USE if target not in edges[source]} == set(), (
        "no longer imported: drop it from UPWARD_AT_FIRST_USE"
    )


def test_imports_flow_down_the_layers() -> None:
    upward = []
    for name, targets in _run_time_edges().items():
        layer = _layer(name)
        for target in sorted(targets):
            target_layer = _layer(target)
            if None not in (layer, target_layer) and target_layer > layer and (name, target) not in UPWARD_AT_FIRST_USE:  # type: ignore[operator]
                upward.append(f"{name} imports {target}")
    assert upward == []


def test_no_module_takes_another_modules_private_names() -> None:
    taken = []
    for module in MODULES.values():
        for node, _ in module.imports:
            for source, name in _targets(module, node):
                if name is not None and name.startswith("_") and not name.startswith("__") and source != module.name:
                    taken.append(f"{module.relative}:{node.lineno} takes {name} from {source}")
    assert taken == []


def _body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = function.body
    if (
        len(body) > 1
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    return (function.end_lineno or body[-1].lineno) - body[0].lineno + 1


def test_modules_and_functions_stay_small() -> None:
    too_long = []
    for module in MODULES.values():
        lines = len(module.path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{module.relative}: {lines} lines")
        for node in ast.walk(module.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(node) > MAX_FUNCTION_LINES:
                too_long.append(f"{module.relative}:{node.lineno} {node.name}(): {_body_lines(node)} lines")
    assert too_long == []


def test_the_wake_engine_is_reached_only_through_its_face() -> None:
    # ``aiogpu._wait`` (its ``__init__``) is the engine's whole public face.
    reached = []
    for module in MODULES.values():
        if module.name.startswith("aiogpu._wait"):
            continue
        for node, _ in module.imports:
            reached += [
                f"{module.relative}:{node.lineno} imports {target}"
                for target, _ in _targets(module, node)
                if target.startswith("aiogpu._wait.")
            ]
    assert reached == []
