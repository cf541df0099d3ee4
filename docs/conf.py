"""Sphinx configuration of the snens documentation (``make docs``)."""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent / "src"))

import snens  # noqa: E402
import snens_reference  # noqa: E402

snens_reference.write(DOCS)  # the config, CLI and preset references, from the code

project = "snens"
author = "the snens authors"
copyright = "2026, the snens authors"  # noqa: A001
release = snens.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",
    "snens_reference",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "howto/scripts", "study/sections"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
# a method without a docstring of its own (an nn.Module's forward) shows none, not torch's
autodoc_inherit_docstrings = False
# types in the signature, as PyTorch's reference shows them: merged into the description they
# would follow a docstring's Shape section as a second Parameters/Return type list
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_custom_sections = [("Shape", "notes_style")]

html_theme = "furo"
html_title = f"snens {release}"
