"""``.. api-names:: MODULE``: the API reference of one public module, generated from the installed package.

Every public name of the module (its ``__all__``, plus the functions and classes defined in it whose names do not start
with ``_``) gets an autodoc entry, each object documented once in the whole reference: under ``paddle_rt.NAME`` when
the top-level package exports that very object, else under ``MODULE.NAME``; a name already documented by a module
earlier in :data:`conf.api_modules` is left to that module's page. A new public name thus appears in the reference
without editing any page, and ``tests/test_docs.py`` checks that every one did.
"""
import importlib
import inspect

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.ext.autodoc.mock import mock
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def public_names(module):
    """The public names of ``module``: ``__all__`` and the non-underscore functions and classes defined in it."""
    names = list(getattr(module, "__all__", []))
    for name, obj in vars(module).items():
        if (not name.startswith("_") and name not in names and (inspect.isclass(obj) or inspect.isroutine(obj))
                and getattr(obj, "__module__", None) == module.__name__):
            names.append(name)
    return names


def documented_name(module, name):
    """The dotted name under which ``module.name`` is documented."""
    top = importlib.import_module("paddle_rt")
    obj = getattr(module, name)
    if name in getattr(top, "__all__", ()) and getattr(top, name, None) is obj:
        return f"paddle_rt.{name}"
    return f"{module.__name__}.{name}"


def plan(modules, mocked=()):
    """{module name: [(documented name, object)]}: who documents what, each dotted name once, submodules skipped.
    ``mocked``: optional dependencies that are not installed (conf.py's ``autodoc_mock_imports``)."""
    seen, out = set(), {}
    for modname in modules:
        with mock(list(mocked)):
            module = importlib.import_module(modname)
        out[modname] = []
        for name in public_names(module):
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                continue              # a public submodule: it has its own page
            full = documented_name(module, name)
            if full not in seen:
                seen.add(full)
                out[modname].append((full, obj))
    return out


def _short_repr(obj, limit=160):
    text = repr(obj).replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 5] + " ...)"


def _attr_doc(full):
    """The ``#:`` comment above the assignment of ``full`` in its Python module, or []."""
    from sphinx.pycode import ModuleAnalyzer
    from sphinx.pycode import PycodeError
    modname, _, name = full.rpartition(".")
    try:
        docs = ModuleAnalyzer.for_module(modname).find_attr_docs()
    except PycodeError:
        return []
    return list(docs.get(("", name), []))


def _directive(obj):
    if inspect.isclass(obj):
        return "autoexception" if issubclass(obj, BaseException) else "autoclass"
    if inspect.isroutine(obj) or callable(obj):
        return "autofunction"
    return "autodata"


class ApiNames(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self):
        modname = self.arguments[0]
        mine = plan(self.config.api_modules, self.config.autodoc_mock_imports).get(modname)
        if mine is None:
            raise self.error(f"api-names: {modname} is not in conf.py's api_modules")
        lines = [f".. automodule:: {modname}", "   :no-members:", ""]
        if mine:
            # constants are left out of the table: autosummary would summarise the docstring of their type
            local = [full[len(modname) + 1:] if full.startswith(modname + ".") else full
                     for full, obj in mine if _directive(obj) != "autodata"]
            lines += [".. autosummary::", ""] + [f"   ~{name}" for name in local] + [""]
        for full, obj in mine:
            if _directive(obj) == "autodata":
                # a constant: its own #: comment where the module has one, else its value (autodoc would show the
                # docstring of the value's type, dict's or tuple's)
                owner, _, name = full.rpartition(".")
                lines += [f".. py:data:: {name}", f"   :module: {owner}", f"   :value: {_short_repr(obj)}", ""]
                lines += ["   " + ln for ln in _attr_doc(full)] + [""]
            else:
                lines += [f".. {_directive(obj)}:: {full}", ""]
        container = nodes.container()
        nested_parse_with_titles(self.state, StringList(lines, source=self.get_source_info()[0]), container)
        return container.children


def _drop_self(app, what, name, obj, options, signature, return_annotation):
    """Cython's embedded signatures of methods start with ``self`` (binding=False): show them as Python's do."""
    if what in ("method", "property", "attribute") and signature and signature.startswith("(self"):
        signature = "(" + signature[len("(self"):].lstrip(", ")
    return signature, return_annotation


def setup(app):
    app.add_config_value("api_modules", [], "env")
    app.connect("autodoc-process-signature", _drop_self)
    app.add_directive("api-names", ApiNames)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
