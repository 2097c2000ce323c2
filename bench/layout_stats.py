"""The layout's size figures, rerunnable on any checkout (issue 23's before/after).

    python bench/layout_stats.py [ROOT]

Prints the largest modules and classes of ``otel_verl/`` (lines), the instance attributes and
locks of ``DurableSpanExporter``, and every import from the write pipeline
(``otel_verl/exporters/``, or the old flat ``_spool``/``_processor``/... modules) into the read side
(``otel_verl.store``). Reads the files as source (``ast``); imports nothing of the project.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

WRITE_SIDE = ("exporters/", "_spool.py", "_processor.py", "_tail.py", "_scrub.py",
              "_file_exporter.py")


def _classes(tree: ast.AST) -> list[ast.ClassDef]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]


def _self_attributes(cls: ast.ClassDef) -> set[str]:
    names = set()
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == "self"):
                names.add(target.attr)
    return names


def _locks(cls: ast.ClassDef) -> int:
    count = 0
    for node in ast.walk(cls):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("Lock", "RLock", "Condition"):
                count += 1
    return count


def main(root: Path) -> None:
    package = root / "otel_verl"
    modules = []
    classes = []
    arrows = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        text = path.read_text()
        tree = ast.parse(text)
        modules.append((len(text.splitlines()), rel))
        for cls in _classes(tree):
            size = (cls.end_lineno or cls.lineno) - cls.lineno + 1
            classes.append((size, f"{rel}:{cls.name}", cls))
        if rel.startswith(WRITE_SIDE):
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and (
                        node.module == "otel_verl.store" or node.module.startswith("otel_verl.store.")):
                    arrows.append(f"{rel}:{node.lineno} imports {node.module}")
    print("largest modules (lines):")
    for size, rel in sorted(modules, reverse=True)[:6]:
        print(f"  {size:5d}  otel_verl/{rel}")
    print("largest classes (lines):")
    for size, name, _ in sorted(classes, key=lambda c: -c[0])[:6]:
        print(f"  {size:5d}  {name}")
    over = [name for size, name, _ in classes if size > 250]
    print(f"classes over 250 lines: {len(over)} {over}")
    for size, name, cls in classes:
        if name.endswith(":DurableSpanExporter"):
            print(f"DurableSpanExporter: {size} lines, {len(_self_attributes(cls))} instance "
                  f"attributes, {_locks(cls)} locks ({name})")
    print(f"write side -> read side imports: {len(arrows)}")
    for arrow in arrows:
        print(f"  {arrow}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent))
