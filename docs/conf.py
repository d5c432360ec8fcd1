"""Sphinx configuration: the user guide and the API reference generated from docstrings.

Built by CI in a virtual environment holding only ``.[docs]``, with warnings as errors:
``sphinx-build -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import aiogpu

project = "aiogpu"
author = "the aiogpu developers"
release = version = aiogpu.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
# The pytest plugin's module imports pytest, which the docs extra does not install: autodoc
# imports it against a stand-in (fixture decorators are unwrapped), with or without pytest.
autodoc_mock_imports = ["pytest"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Names the docstrings mention but that live in other projects (no network in the build).
nitpicky = False
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = f"aiogpu {release}"
