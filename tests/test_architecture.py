"""The arrows that must never exist (shared/DESIGN.md), checked on the source itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def tops(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imported_modules(path)}


@pytest.mark.parametrize("path", files("packtool"), ids=lambda p: str(p.relative_to(ROOT)))
def test_packtool_never_imports_torch_and_only_the_cli_imports_click(path):
    used = tops(path)
    assert "torch" not in used
    if path.name not in ("cli.py", "cli_sft.py"):  # the command-line modules
        assert "click" not in used


@pytest.mark.parametrize("path", files("attention"), ids=lambda p: str(p.relative_to(ROOT)))
def test_attention_takes_a_batch_dict_not_the_loader(path):
    assert not tops(path) & {"loader", "packtool"}


@pytest.mark.parametrize("name", ["pack.py", "kernels.py"])
def test_packing_is_pure(name):
    used = imported_modules(ROOT / "packtool" / name)
    assert not used & {"pyarrow.parquet", "os", "pathlib", "shutil", "io"}


def test_the_architecture_test_sees_real_imports():
    # Guards the guard: the CLI does import click, the model does import torch.
    assert "click" in tops(ROOT / "packtool" / "cli.py")
    assert "torch" in tops(ROOT / "attention" / "model.py")


@pytest.mark.parametrize("path", files("packtool"), ids=lambda p: str(p.relative_to(ROOT)))
def test_packtool_modules_stay_small(path):
    # STYLE.md: one concept per module, split before ~600 lines.
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= 600, f"{path.name} has {lines} lines; split it along a real seam"


@pytest.mark.parametrize(
    "path", files("loader") + files("attention"), ids=lambda p: str(p.relative_to(ROOT))
)
def test_loader_and_attention_modules_stay_small(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= 600, f"{path.name} has {lines} lines; split it along a real seam"


# benchmarks/gpu_check.sh runs on a GPU machine whose image has torch, numpy, pytest and
# hypothesis but none of packtool's own dependencies, and nothing can be installed there.
GPU_RUN = ("tests/attention/test_varlen_gpu.py", "benchmarks/bench_train.py", "tests/conftest.py")
GPU_IMAGE_HAS = {"torch", "numpy", "pytest", "hypothesis"}
OPTIONAL = {"flash_attn"}  # imported behind a guard: without it the backend says it is missing


def _local_file(module: str) -> Path | None:
    for candidate in (ROOT / f"{module.replace('.', '/')}.py", ROOT / module.replace(".", "/")):
        if candidate.is_file():
            return candidate
        if (candidate / "__init__.py").is_file():
            return candidate / "__init__.py"
    return None


def test_the_gpu_run_needs_only_what_the_gpu_image_has():
    seen: set[Path] = set()
    todo = [ROOT / p for p in GPU_RUN]
    outside: dict[str, str] = {}
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in imported_modules(path):
            top = module.split(".")[0]
            local = _local_file(module) or _local_file(top)
            if local is not None:
                # `from pkg.mod import x` runs pkg/__init__.py too.
                parts = module.split(".")
                todo += [
                    f for i in range(1, len(parts) + 1) if (f := _local_file(".".join(parts[:i])))
                ]
            elif top not in sys.stdlib_module_names | GPU_IMAGE_HAS | OPTIONAL:
                outside[module] = str(path.relative_to(ROOT))
    assert ROOT / "attention" / "model.py" in seen  # the walk follows project imports
    assert not outside, f"the GPU run would import what its image lacks: {outside}"


def test_no_merge_conflict_markers_are_committed():
    # An unresolved merge once landed in README.md's architecture list; git lets it through.
    markers = ("<" * 7 + " ", "=" * 7 + "\n", ">" * 7 + " ")
    found = []
    for folder in ("packtool", "loader", "attention", "benchmarks", "docs", "tests", "examples"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".md", ".yaml", ".json", ".toml") and path.is_file():
                text = path.read_text(encoding="utf-8", errors="replace")
                found += [str(path) for m in markers if f"\n{m}" in text]
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found += ["README.md" for m in markers if f"\n{m}" in text]
    assert not found
