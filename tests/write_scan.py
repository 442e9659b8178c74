"""The AST scan of file writes (open in a write mode, os.open with O_CREAT, save-like calls), shared by the writer
inventories of tests/test_trust16_writers.py (hybrid/, models/) and tests/test_trust17_scripts_writers.py
(scripts/); a module of its own so the second does not import the first's heavy fixtures."""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WRITE_MODES = {"w", "wb", "a", "ab", "x", "xb", "w+", "wb+", "r+", "rb+", "a+"}
SAVE_CALLS = {"save", "savefig", "save_file", "to_json_file", "save_pretrained", "tofile", "write_text", "write_bytes",
              "SummaryWriter", "fdopen"}


def _mode(call: ast.Call):
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return mode.value if isinstance(mode, ast.Constant) else None


def _writes(path: str) -> set[tuple[str, str, str]]:
    rel = os.path.relpath(path, ROOT)
    out = set()

    def visit(node, where: str):
        for child in ast.iter_child_nodes(node):
            name = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{where}.{child.name}" if where else child.name
            if isinstance(child, ast.Call):
                f = child.func
                called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                on_os = isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "os"
                if called == "open" and not on_os and _mode(child) in WRITE_MODES:
                    out.add((rel, name, f"open({_mode(child)})"))
                elif called == "open" and on_os and any("O_CREAT" in ast.unparse(a) for a in child.args[1:]):
                    out.add((rel, name, "os.open"))
                elif called in SAVE_CALLS and not (on_os and called != "fdopen"):
                    out.add((rel, name, f"os.{called}" if on_os else called))
            visit(child, name)
    visit(ast.parse(open(path).read(), path), "")
    return out
