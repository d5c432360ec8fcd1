"""The API page documents every public name, and the docs build needs nothing but the docs extra."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import aiogpu
import aiogpu.testing

DOCS = Path(__file__).parent.parent / "docs"
PLUGIN = Path(aiogpu.testing.__file__).parent / "pytest_plugin.py"


def documented_names() -> set[str]:
    """The objects ``docs/api.rst`` documents with a directive (``.. autoclass:: aiogpu.Event``)."""
    text = (DOCS / "api.rst").read_text(encoding="utf-8")
    return set(re.findall(r"^\.\. (?:auto\w+|py:\w+):: ([\w.]+)\s*$", text, flags=re.MULTILINE))


def test_every_public_name_is_on_the_api_page() -> None:
    documented = documented_names()
    for module in (aiogpu, aiogpu.testing):
        missing = [name for name in module.__all__ if f"{module.__name__}.{name}" not in documented]
        assert missing == [], f"docs/api.rst lacks {module.__name__}: {missing}"


def test_every_fixture_of_the_pytest_plugin_is_on_the_api_page() -> None:
    fixtures = {
        node.name
        for node in ast.parse(PLUGIN.read_text(encoding="utf-8")).body
        if isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(decorator) for decorator in node.decorator_list)
    }
    assert fixtures == {"simulated_gpu", "simulated_device"}
    text = (DOCS / "api.rst").read_text(encoding="utf-8")
    block = re.search(r"^\.\. automodule:: aiogpu\.testing\.pytest_plugin\n((?:   .*\n)*)", text, flags=re.MULTILINE)
    assert block is not None, "docs/api.rst does not document aiogpu.testing.pytest_plugin"
    members = re.search(r":members: (.*)", block[1])
    assert members is not None
    assert {name.strip() for name in members[1].split(",")} == fixtures


def test_the_docs_build_mocks_pytest() -> None:
    # The docs extra does not install pytest, which the plugin's module imports: without the
    # mock, autodoc fails to import it (an error under -W, a missing section without).
    namespace: dict[str, object] = {}
    source = (DOCS / "conf.py").read_text(encoding="utf-8")
    exec(compile(source, str(DOCS / "conf.py"), "exec"), namespace)
    assert "pytest" in namespace["autodoc_mock_imports"]  # type: ignore[operator]
