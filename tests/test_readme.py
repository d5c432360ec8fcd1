"""The README's Python snippets run: on the GPU where there is one, otherwise on the simulated device.

A snippet that defines tests runs under pytest with aiogpu's plugin; any other runs as a script.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
README_LIMIT = 12 * 1024  # the README is the package's long description: a pitch, not a manual


def python_snippets() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", README.read_text(encoding="utf-8"), flags=re.DOTALL | re.MULTILINE)


def run(arguments: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, *arguments], capture_output=True, text=True, timeout=120, check=False, cwd=cwd, env=environment
    )


def test_the_readme_has_an_asyncio_a_trio_and_a_test_snippet() -> None:
    snippets = python_snippets()
    assert any("asyncio.run(main())" in snippet for snippet in snippets)
    assert any("trio.run(main)" in snippet for snippet in snippets)
    assert any("def test_" in snippet for snippet in snippets)


@pytest.mark.parametrize("index", range(len(python_snippets())))
def test_readme_snippet_runs(index: int, tmp_path: Path) -> None:
    snippet = python_snippets()[index]
    if re.search(r"^import trio$", snippet, flags=re.MULTILINE):
        pytest.importorskip("trio")
    if "def test_" in snippet:
        (tmp_path / "test_snippet.py").write_text(snippet, encoding="utf-8")
        result = run(
            ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "aiogpu.testing.pytest_plugin", "test_snippet.py"], tmp_path
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert re.search(r"\b[1-9]\d* passed\b", result.stdout), result.stdout
        assert "skipped" not in result.stdout, result.stdout
    else:
        (tmp_path / "snippet.py").write_text(snippet, encoding="utf-8")
        result = run(["snippet.py"], tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.strip(), "the snippet printed nothing"


def test_the_readme_fits_a_long_description() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) <= README_LIMIT
    # PyPI renders the README without the repository around it: a relative link breaks there.
    relative = [target for target in re.findall(r"\]\(([^)]+)\)", text) if not re.match(r"[a-z]+:|#", target)]
    assert relative == [], f"relative links break on PyPI; name the file in code font instead: {relative}"
