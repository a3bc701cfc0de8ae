"""Sphinx configuration of paddle_rt's documentation: MyST Markdown pages, furo, and an API reference generated from
the docstrings of the installed package (``sphinx-build -W --keep-going -b html docs docs/_build/html``)."""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(HERE)

# Document the installed paddle_rt, never the checkout's sources by accident: `python -m sphinx` run from the checkout's
# top puts that folder first on sys.path, where paddle_rt has no compiled core unless it was built in place. A
# PYTHONPATH naming the checkout (an in-place build, on purpose) is kept.
_explicit = {os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
sys.path[:] = [p for p in sys.path
               if os.path.realpath(p or os.getcwd()) != os.path.realpath(CHECKOUT)
               or os.path.realpath(p or os.getcwd()) in _explicit]
sys.path.insert(0, os.path.join(HERE, "_ext"))

try:
    import paddle_rt  # noqa: E402
except ImportError as exc:
    raise ImportError(f"the API reference documents the installed paddle_rt: install it first (`pip install .` from "
                      f"the checkout's top), then build the docs ({exc})") from exc

project = "paddle_rt"
author = "the paddle_rt authors"
copyright = "the paddle_rt authors"
release = version = paddle_rt.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "api_names",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4

# The Cython modules are compiled with embedsignature=True: a docstring's first line is the signature.
autodoc_docstring_signature = True
# paddle_rt.triton needs the triton extra (torch, triton, ninetoothed): where it is not installed, its reference is
# built from the module's own text with those imports mocked.
autodoc_mock_imports = [name for name in ("torch", "triton", "ninetoothed") if importlib.util.find_spec(name) is None]
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autosummary_generate = False

html_theme = "furo"
html_title = f"paddle_rt {release}"
html_static_path = []

# The public modules, in the order that decides where a re-exported object is documented (docs/_ext/api_names.py):
# paddle_rt.memory, .streams and .pool own the names the top-level package re-exports from them.
api_modules = [
    "paddle_rt.memory", "paddle_rt.streams", "paddle_rt.pool", "paddle_rt", "paddle_rt.ccl", "paddle_rt.op",
    "paddle_rt.ops", "paddle_rt.profiler", "paddle_rt.triton", "paddle_rt.plugins",
]
