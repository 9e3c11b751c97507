"""Read a vLLM release's Python sources (an installed package, an unpacked tree or a wheel)
without importing them, and check the seam table against them.

vLLM-free: `tools/check_vllm_seam.py` runs this on a release that is not installed, and
`tests/seam/test_seam.py` on the installed one (where it must agree with `inspect`).
"""

from __future__ import annotations

import ast
import inspect
import re
import zipfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from vllm_idlm.seam.table import CALLABLE_KINDS, Touch


def signature_of(obj) -> str:
    """`inspect.signature` of a live callable as the table writes it: names only, `=` for a
    default, `*` / `/` markers."""
    items: list[str] = []
    params = list(inspect.signature(obj).parameters.values())
    star = False
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and not star:
            items.append("*")
            star = True
        if p.kind is p.VAR_POSITIONAL:
            items.append("*" + p.name)
            star = True
        elif p.kind is p.VAR_KEYWORD:
            items.append("**" + p.name)
        else:
            items.append(p.name + ("=" if p.default is not p.empty else ""))
        last_positional = i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY
        if p.kind is p.POSITIONAL_ONLY and last_positional:
            items.append("/")
    return ", ".join(items)


def _signature_of_def(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The same rendering from a `def`; a classmethod drops `cls` as `inspect` does through
    the class."""
    a = node.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    items: list[str] = []
    for i, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        items.append(arg.arg + ("=" if default is not None else ""))
        if a.posonlyargs and i == len(a.posonlyargs) - 1:
            items.append("/")
    if a.vararg:
        items.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        items.append("*")
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        items.append(arg.arg + ("=" if default is not None else ""))
    if a.kwarg:
        items.append("**" + a.kwarg.arg)
    decorators = {getattr(d, "id", getattr(d, "attr", None)) for d in node.decorator_list}
    if "classmethod" in decorators and items:
        items = items[1:]
    return ", ".join(items)


@dataclass(frozen=True)
class Found:
    module: str
    node: ast.AST


class VllmSources:
    """The `vllm` package of a directory (one holding `vllm/`, or `vllm/` itself) or a wheel."""

    def __init__(self, root: str | Path) -> None:
        root = Path(root)
        self._zip = zipfile.ZipFile(root) if root.suffix == ".whl" else None
        if self._zip is None and (root / "__init__.py").is_file() and root.name == "vllm":
            root = root.parent
        self._root = root
        self._trees: dict[str, ast.Module | None] = {}
        self._packages: set[str] = set()  # modules read from a package's __init__.py

    def text(self, path: str) -> str | None:
        if self._zip is not None:
            try:
                return self._zip.read(path).decode()
            except KeyError:
                return None
        file = self._root / path
        return file.read_text() if file.is_file() else None

    def paths(self) -> list[str]:
        if self._zip is not None:
            return [n for n in self._zip.namelist() if n.startswith("vllm/") and n.endswith(".py")]
        return [str(p.relative_to(self._root)) for p in (self._root / "vllm").rglob("*.py")]

    @property
    def version(self) -> str:
        text = self.text("vllm/_version.py") or ""
        match = re.search(r"""version\s*=\s*['"]([^'"]+)['"]""", text)
        return match[1] if match else "unknown"

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            base = module.replace(".", "/")
            text = self.text(base + ".py")
            if text is None:
                text = self.text(base + "/__init__.py")
                if text is not None:
                    self._packages.add(module)
            self._trees[module] = ast.parse(text) if text is not None else None
        return self._trees[module]

    def find(self, module: str, qualname: str) -> Found | None:
        first, *rest = qualname.split(".")
        found = self._top(module, first, 0)
        for part in rest:
            if found is None or not isinstance(found.node, ast.ClassDef):
                return None
            found = self._member(found, part)
        return found

    def _top(self, module: str, name: str, depth: int) -> Found | None:
        tree = self.tree(module)
        if tree is None or depth > 8:
            return None
        for stmt in _runtime_statements(tree.body):
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if stmt.name == name:
                    return Found(module, stmt)
            elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return Found(module, stmt)
            elif isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(module, stmt, module in self._packages)
                        return self._top(source, alias.name, depth + 1) or (
                            Found(f"{source}.{alias.name}", stmt)
                            if self.tree(f"{source}.{alias.name}") is not None
                            else None
                        )
        # A name served by the module's own __getattr__ (vllm.platforms' current_platform).
        for stmt in tree.body:
            is_getattr = isinstance(stmt, ast.FunctionDef) and stmt.name == "__getattr__"
            if is_getattr and _mentions(stmt, name):
                return Found(module, stmt)
        return None

    def _member(self, cls: Found, name: str) -> Found | None:
        """`name` defined in the class body, else in its bases (followed through imports)."""
        for stmt in cls.node.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if stmt.name == name:
                    return Found(cls.module, stmt)
            elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return Found(cls.module, stmt)
        for base in self._bases(cls):
            found = self._member(base, name)
            if found is not None:
                return found
        return None

    def _bases(self, cls: Found) -> list[Found]:
        out = []
        for base in cls.node.bases:
            if isinstance(base, ast.Name):
                found = self._top(cls.module, base.id, 0)
                if found is not None and isinstance(found.node, ast.ClassDef):
                    out.append(found)
        return out

    def has_attribute(self, cls: Found, name: str) -> bool:
        """A class-level name, or `self.<name>` assigned in a method, here or in a base."""
        if self._member(cls, name) is not None:
            return True
        for node in ast.walk(cls.node):
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            for t in targets:
                if (
                    isinstance(t, ast.Attribute)
                    and t.attr == name
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    return True
        return any(self.has_attribute(base, name) for base in self._bases(cls))

    @cache  # noqa: B019 (one VllmSources per release, alive as long as the check)
    def definitions(self) -> dict[str, list[str]]:
        """Where each top-level or class-level def / class of the tree is: name -> modules."""
        out: dict[str, list[str]] = {}
        pattern = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)", re.M)
        for path in self.paths():
            module = path[:-3].replace("/", ".").removesuffix(".__init__")
            for name in set(pattern.findall(self.text(path) or "")):
                out.setdefault(name, []).append(module)
        return out


def _runtime_statements(body: list[ast.stmt]):
    """Top-level statements, with those under `if` / `try` (not `if TYPE_CHECKING:`)."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            if "TYPE_CHECKING" in ast.unparse(stmt.test):
                yield from _runtime_statements(stmt.orelse)
                continue
            yield from _runtime_statements(stmt.body + stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from _runtime_statements(stmt.body + stmt.orelse)
            for handler in stmt.handlers:
                yield from _runtime_statements(handler.body)
        else:
            yield stmt


def _absolute(module: str, stmt: ast.ImportFrom, is_package_init: bool) -> str:
    if not stmt.level:
        return stmt.module or ""
    parts = module.split(".")
    # Relative to the package: a module's package is its parent; a package's is itself.
    keep = len(parts) - stmt.level + (1 if is_package_init else 0)
    base = ".".join(parts[:keep])
    return f"{base}.{stmt.module}" if stmt.module else base


def _mentions(node: ast.AST, literal: str) -> bool:
    return any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value == literal
        for n in ast.walk(node)
    )


@dataclass(frozen=True)
class Finding:
    """What changed about a touch: `breaks` it, or `compatible` (a called function gained
    parameters with defaults: the plugin's call still works)."""

    status: str
    message: str


def check(sources: VllmSources, touch: Touch) -> Finding | None:
    """What is wrong with `touch` in these sources (None: it holds as the table says)."""
    found = sources.find(touch.module, touch.qualname)
    if touch.kind == "add":
        return None if found is None else Finding("breaks", f"vLLM defines {touch.qualname}")
    if found is None:
        owner, *member = touch.qualname.split(".")
        if member and sources.find(touch.module, owner) is not None:
            return Finding("breaks", f"{owner} has no {'.'.join(member)}")
        where = sorted(set(sources.definitions().get(owner, [])) - {touch.module})
        if where:
            shown = ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
            return Finding("breaks", f"moved? no {owner} in {touch.module}; one in {shown}")
        return Finding("breaks", f"vanished: no {owner} anywhere")
    node = found.node
    if touch.kind in CALLABLE_KINDS and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        now = _signature_of_def(node)
        if now != touch.params:
            status = "compatible" if _extends(touch.params, now, touch.kind) else "breaks"
            return Finding(status, f"signature ({touch.params}) is now ({now})")
    if touch.kind == "fields":
        if not isinstance(node, ast.ClassDef):
            return Finding("breaks", "no longer a class")
        missing = [n for n in touch.params.split() if not sources.has_attribute(found, n)]
        if missing:
            return Finding("breaks", f"has no {' '.join(missing)}")
    if touch.kind == "mentions" and not _mentions(node, touch.params):
        return Finding("breaks", f"no longer mentions {touch.params!r}")
    return None


def _extends(was: str, now: str, kind: str) -> bool:
    """A call with the old arguments still fits: the old parameters first, every new one
    optional."""
    old, new = was.split(", "), now.split(", ")
    extra = new[len(old) :]
    optional = all(p.endswith("=") or p.startswith("*") for p in extra)
    return kind == "call" and new[: len(old)] == old and optional
