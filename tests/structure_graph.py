"""The dependency graphs of paddle_rt's own files, for tests/test_structure.py (and runnable alone:
``python tests/structure_graph.py`` prints every circle found, exit status 1 if there is one).

- Python and Cython: a node per module (``x.pyx`` and its ``x.pxd`` are one module); an edge for every ``import`` and
  ``cimport`` of another paddle_rt module, wherever it is written (module level or inside a function: a lazy import
  is still a dependency). ``.py`` files are read with ``ast``; ``.pyx``/``.pxd`` files, which ``ast`` cannot parse,
  line by line (their import statements are Python's syntax plus ``cimport``).
- C: a node per file of a plugin folder (rt_cpu); an edge A -> B when A's object file needs (``nm -u``) a symbol that
  B's defines. The objects are compiled for the test, so the graph is that of the sources as they are.
"""
import ast
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "paddle_rt")
RT_CPU = os.path.join(PACKAGE, "plugins", "rt_cpu")


def module_files(package=PACKAGE):
    """{module name: [files]} of every .py/.pyx/.pxd under the package (a .pyx and its .pxd share a name)."""
    out = {}
    top = os.path.dirname(package)
    for dirpath, dirnames, filenames in os.walk(package):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in filenames:
            stem, ext = os.path.splitext(f)
            if ext not in (".py", ".pyx", ".pxd"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, stem), top).split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out.setdefault(".".join(rel), []).append(os.path.join(dirpath, f))
    return out


def _absolute(name, level, current, is_package):
    if not level:
        return name
    base = current.split(".")
    base = base if is_package else base[:-1]
    if level > 1:
        base = base[:-(level - 1)]
    return ".".join(base + ([name] if name else []))


def _python_imports(path, current):
    """[(module, [names])] imported anywhere in a .py file."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    is_package = os.path.basename(path) == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((_absolute(node.module or "", node.level, current, is_package), [a.name for a in node.names]))
    return out


_FROM = re.compile(r"^\s*from\s+(\.*)([\w.]*)\s+c?import\s+(\(?)([^#]*)")
_IMPORT = re.compile(r"^\s*c?import\s+([^#]*)")


def _cython_imports(path, current):
    """[(module, [names])] imported or cimported anywhere in a .pyx/.pxd file."""
    out = []
    lines = open(path, encoding="utf-8").read().splitlines()
    for i, line in enumerate(lines):
        m = _FROM.match(line)
        if m:
            text = m.group(4)
            j = i
            # a parenthesised list over lines (only an opening parenthesis of the statement: not one in a comment)
            while m.group(3) and ")" not in text and j + 1 < len(lines):
                j += 1
                text += " " + lines[j].split("#")[0]
            names = [n.split(" as ")[0].strip() for n in text.replace(")", "").split(",") if n.strip()]
            out.append((_absolute(m.group(2), len(m.group(1)), current, False), names))
            continue
        m = _IMPORT.match(line)
        if m and not line.lstrip().startswith(("import_array", "cimport_")):
            out += [(n.split(" as ")[0].strip(), []) for n in m.group(1).split(",") if n.strip()]
    return out


def import_graph(package=PACKAGE):
    """{module: set(modules it imports)} over paddle_rt's own modules."""
    modules = module_files(package)
    graph = {m: set() for m in modules}
    for m, files in modules.items():
        for path in files:
            reader = _python_imports if path.endswith(".py") else _cython_imports
            for target, names in reader(path, m):
                found = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
                if not found and target in modules:
                    found = [target]
                if not found:  # "import paddle_rt._core.errors.X": the longest prefix that is a module
                    parts = target.split(".")
                    while parts and ".".join(parts) not in modules:
                        parts.pop()
                    found = [".".join(parts)] if parts else []
                graph[m].update(t for t in found if t != m)
    return graph


def c_call_graph(folder=RT_CPU, include=os.path.join(PACKAGE, "include"), cc=os.environ.get("CC", "cc")):
    """{file: set(files whose functions or data it uses)} of a plugin folder's .c files, from their objects."""
    sources = sorted(f for f in os.listdir(folder) if f.endswith(".c"))
    defined, needed = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for src in sources:
            obj = os.path.join(tmp, src + ".o")
            subprocess.run([cc, "-c", "-fPIC", "-O2", "-I", include, "-I", folder, os.path.join(folder, src),
                            "-o", obj], check=True)
            nm = subprocess.run(["nm", obj], check=True, capture_output=True, text=True).stdout
            defined[src], needed[src] = set(), set()
            for line in nm.splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == "U":
                    needed[src].add(parts[1])
                elif len(parts) == 3 and parts[1] in "TDBRVW" and parts[1].isupper():
                    defined[src].add(parts[2])
    return {a: {b for b in sources if b != a and needed[a] & defined[b]} for a in sources}


def circles(graph):
    """Every strongly connected component of more than one node (Tarjan), each sorted; [] when there is none."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def main():
    found = 0
    for name, graph in (("imports (Python and Cython)", import_graph()), ("rt_cpu's C calls", c_call_graph())):
        c = circles(graph)
        print(f"{name}: {len(graph)} nodes, {sum(map(len, graph.values()))} edges, {len(c)} circle(s)")
        for comp in c:
            print("  circle: " + " <-> ".join(comp))
        found += len(c)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
