"""The SDK's modules form layers: no import cycle (counting imports inside functions and under
`TYPE_CHECKING`, which is how cycles used to be hidden), and no module takes a private name
(`_x`) from another."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import toolbus

PACKAGE = "toolbus"


def test_the_sdk_has_no_import_cycle() -> None:
    graph = grimp.build_graph(PACKAGE)
    cycles = [
        (importer, imported)
        for importer in sorted(graph.modules)
        for imported in sorted(graph.find_modules_directly_imported_by(importer))
        if graph.chain_exists(importer=imported, imported=importer)
    ]
    assert cycles == [], f"imports closing a cycle (importer, imported): {cycles}"


def test_no_module_imports_a_private_name_of_another() -> None:
    root = Path(toolbus.__file__).parent
    reaches = [
        f"{path.relative_to(root)}:{node.lineno} {alias.name} from {node.module}"
        for path in sorted(root.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE)
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert reaches == []
