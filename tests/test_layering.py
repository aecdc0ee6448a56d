"""Tier 1: the imports follow ARCHITECTURE.md's table of parts, and the pure parts stay pure.

The table is read from ARCHITECTURE.md itself, so the map cannot drift from the code: a new
folder or module without a row fails, and so does an import the row does not allow."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tracer"
PURE = ("parse", "analysis")
IMPURE_MODULES = {"subprocess", "socket", "ctypes", "threading", "time", "pathlib", "shutil"}


def allowed() -> dict[str, set[str] | None]:
    """part → the parts it may import (None: any), from the table's rows."""
    rows: dict[str, set[str] | None] = {}
    for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines():
        m = re.match(r"^\| `(\w+)` \|[^|]*\|([^|]*)\|$", line)
        if m:
            may = m.group(2).strip()
            rows[m.group(1)] = None if may == "any" else set(re.findall(r"`(\w+)`", may))
    return rows


def part_of(module: str) -> str:
    """tracer.analysis.rules → analysis; tracer.cli → cli; tracer → tracer."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tracer"


def modules() -> list[tuple[str, Path]]:
    out = []
    for f in sorted(PACKAGE.rglob("*.py")):
        rel = f.relative_to(ROOT).with_suffix("").parts
        name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
        out.append((name, f))
    return out


def imports(name: str, path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, at any level, relative ones resolved; a
    ``from tracer import x`` names the module ``tracer.x`` when x is one."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join([*base, *([node.module] if node.module else [])])
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                as_module = PACKAGE.joinpath(*sub.split(".")[1:])
                is_module = as_module.with_suffix(".py").exists() or as_module.is_dir()
                found.append((node.lineno, sub if mod.startswith("tracer") and is_module else mod))
    return found


def test_every_part_of_the_package_has_a_row() -> None:
    rows = allowed()
    assert len(rows) > 10, "ARCHITECTURE.md's table of parts was not found"
    missing = sorted({part_of(name) for name, _ in modules()} - rows.keys())
    assert not missing, f"parts with no row in ARCHITECTURE.md: {missing}"
    gone = sorted(rows.keys() - {part_of(name) for name, _ in modules()})
    assert not gone, f"rows in ARCHITECTURE.md for parts that no longer exist: {gone}"


def test_imports_stay_within_the_table() -> None:
    rows = allowed()
    crossing = []
    for name, path in modules():
        src = part_of(name)
        may = rows.get(src)
        for line, target in imports(name, path):
            if not target.startswith("tracer"):
                continue
            dst = part_of(target)
            if may is not None and dst != src and dst not in may:
                crossing.append(f"{path.relative_to(ROOT)}:{line}: {src} imports {target}")
    assert not crossing, "imports that ARCHITECTURE.md does not allow:\n" + "\n".join(crossing)


# Top-level packages beside tracer that are workloads or harnesses, never part of the tool:
# tracer/ may not import them (ARCHITECTURE.md, "Beside the package").
OUTSIDE = ("llm", "tests", "bench")


def outside_imports(found: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [(line, t) for line, t in found if t.split(".")[0] in OUTSIDE]


def test_the_package_imports_nothing_from_beside_it() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {target}"
        for name, path in modules()
        for line, target in outside_imports(imports(name, path))
    ]
    assert not bad, "tracer imports what lives beside it (llm, tests, bench):\n" + "\n".join(bad)


def test_an_import_of_llm_from_tracer_would_fail(tmp_path: Path) -> None:
    """The check above sees every form of the import (module top, function body, from)."""
    f = tmp_path / "x.py"
    f.write_text(
        "import llm.server\nfrom llm import model\ndef f():\n    from llm.image import build\n"
    )
    found = outside_imports(imports("tracer.x", f))
    assert [t for _, t in found] == ["llm.server", "llm", "llm.image"]


@pytest.mark.parametrize("part", PURE)
def test_pure_parts_touch_no_host(part: str) -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {target}"
        for name, path in modules()
        if part_of(name) == part
        for line, target in imports(name, path)
        if target.split(".")[0] in IMPURE_MODULES
    ]
    assert not bad, f"{part} is pure (ARCHITECTURE.md) yet imports:\n" + "\n".join(bad)


def test_the_code_cites_documents_that_exist() -> None:
    cited = {
        f"{path.relative_to(ROOT)}: {doc}"
        for path in [*PACKAGE.rglob("*.py"), *(ROOT / "bpf").glob("*.[ch]")]
        for doc in re.findall(r"\b([A-Z]+\.md)\b", path.read_text())
        if not (ROOT / doc).exists()
    }
    assert not cited, f"documents cited that are not in the repo: {sorted(cited)}"
