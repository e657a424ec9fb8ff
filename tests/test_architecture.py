"""The house rules of docs/architecture.md, checked on the source itself.

Every import counts: module-level, deferred (inside a function) and `TYPE_CHECKING` alike, since
each is an arrow a reader has to follow. The layers are declared here and in
docs/architecture.md (a test below keeps the two the same).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("packtool", "loader", "attention")

PACKTOOL_LAYERS = (
    "",  # the top-level modules: errors, quantities, progress, prefetch, arrow_numpy
    "storage",
    "dataset",
    "pack",
    "mixture",
    "read",
    "tokenizer",
    "sft",
    "tokenize",
    "stats",
    "audit",
    "engines",
    "cli",
)
"""packtool's stages, lowest first: a module may import its own stage and the stages before it."""
LOADER_LAYERS = ("", "store", "order", "packed", "online", "mixture", "hf", "testing")
"""loader's parts, lowest first ("": record.py, config.py, collate.py), as for packtool."""
LOADER_SEES = {"", "storage", "dataset", "pack", "mixture"}
"""What of packtool the loader may import: the format side, the pure packer and schedule."""
NEVER_IN_TRAINING = ("packtool.tokenizer", "packtool.sft", "packtool.cli", "packtool.read")
TOP_LEVEL_MODULES = 12


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _resolve(name: str) -> str | None:
    """The project module `name` refers to (a `from pkg import name` may name an attribute)."""
    modules = project_modules()
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in modules:
            return ".".join(parts[:i])
    return None


def imported_project_modules(path: Path) -> set[str]:
    """The project modules a file imports: `from pkg import sub` is an arrow to `pkg.sub`,
    `from pkg.mod import name` one to `pkg.mod` (the module that defines or re-exports it)."""
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(_resolve(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in project_modules() else _resolve(node.module))
    return {m for m in found if m is not None}


@cache
def import_graph() -> dict[str, frozenset[str]]:
    return {
        name: frozenset(imported_project_modules(path) - {name})
        for name, path in project_modules().items()
    }


def circles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def stage(module: str) -> tuple[str, str]:
    """(package, stage) of a module: `packtool.read.corpus` -> ("packtool", "read");
    `packtool.errors` -> ("packtool", ""); `loader.testing` -> ("loader", "testing")."""
    parts = module.split(".")
    is_package = project_modules()[module].name == "__init__.py"
    if len(parts) >= 3 or (len(parts) == 2 and is_package):
        return parts[0], parts[1]
    if module == "loader.testing":
        return "loader", "testing"
    return parts[0], ""


def test_the_graph_sees_real_imports():
    # Guards the guard: deferred and TYPE_CHECKING imports are arrows too.
    graph = import_graph()
    assert "packtool.dataset.columns" in graph["packtool.pack.chunk"]
    assert "packtool.engines.context" in graph["packtool.engines.merge"]  # TYPE_CHECKING only
    assert "packtool.audit.verify" in graph["packtool.cli.commands"]  # inside a function
    assert circles({"a": frozenset("b"), "b": frozenset("a"), "c": frozenset("a")}) == [["a", "b"]]


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_every_arrow_points_down_the_layers():
    wrong = []
    for source, targets in import_graph().items():
        top, here = stage(source)
        for target in targets:
            other, there = stage(target)
            if source in (top, f"{top}.{here}") and target.startswith(f"{source}."):
                continue  # a package's own overview may name what is inside it
            if top == other == "packtool":
                ok = PACKTOOL_LAYERS.index(there) <= PACKTOOL_LAYERS.index(here)
            elif top == other == "loader":
                ok = LOADER_LAYERS.index(there) <= LOADER_LAYERS.index(here)
            elif (top, other) == ("loader", "packtool"):
                ok = there in LOADER_SEES
            else:  # packtool never imports the loader or attention; attention takes batch dicts
                ok = top == other
            if not ok:
                wrong.append(f"{source} -> {target}")
    assert not wrong, "arrows back up the layers (docs/architecture.md): " + ", ".join(wrong)


def test_every_stage_is_a_declared_layer():
    for name in project_modules():
        top, here = stage(name)
        if top == "packtool":
            assert here in PACKTOOL_LAYERS, f"{name}: stage {here!r} is not in PACKTOOL_LAYERS"
        elif top == "loader":
            assert here in LOADER_LAYERS, f"{name}: part {here!r} is not in LOADER_LAYERS"


def test_the_layers_are_the_ones_the_docs_declare():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    declared = re.search(r"packtool layers, lowest first: (.*)", text)
    assert declared, "docs/architecture.md lists the packtool layers"
    assert [s.strip(" `.") for s in declared.group(1).split("<")] == [
        s or "top-level modules" for s in PACKTOOL_LAYERS
    ]
    declared = re.search(r"loader layers, lowest first: (.*)", text)
    assert declared, "docs/architecture.md lists the loader layers"
    assert [s.strip(" `.") for s in declared.group(1).split("<")] == [
        s or "top-level modules" for s in LOADER_LAYERS
    ]


@pytest.mark.parametrize("package", ["packtool", "loader"])
def test_at_most_a_dozen_modules_at_the_top(package):
    top = [p.name for p in (ROOT / package).glob("*.py")]
    assert len(top) <= TOP_LEVEL_MODULES, f"{package}/ has {len(top)} top-level modules: {top}"


def test_every_subpackage_opens_with_an_overview():
    for init in sorted(ROOT.glob("*/*/__init__.py")):
        if init.parts[-3] not in PACKAGES:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        lines = len(doc.splitlines())
        assert 10 <= lines <= 30, f"{init.relative_to(ROOT)}: overview of {lines} lines (10-30)"


def test_no_module_imports_another_modules_private_names():
    found = []
    for name, path in project_modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and _resolve(node.module):
                private = [a.name for a in node.names if re.match(r"_[^_]", a.name)]
                found += [f"{name}: {node.module}.{p}" for p in private]
    assert not found, found


PRIVATE_REACH = {
    ("loader.collate", "_new_shared"): "torch's shared-memory allocator (it has no public one)",
    ("loader.packed.transport", "_new_shared"): "the same",
    ("loader.hf.trainer", "_packed_expect_first"): "PackedTrainerMixin's flag, set by its callback",
}
"""Where the loader reads or sets a private name of something other than `self` / `cls`: only
of torch, or within the module that defines it."""


def test_the_loader_uses_other_objects_through_their_public_names():
    # A DataLoader wrapper, a dataset and a packer talk through methods that say what they are
    # for (loader/packed/workers.py: the hand-off of a dataset to its loader's workers), not
    # through each other's private attributes.
    found = []
    for name, path in project_modules().items():
        if not name.startswith("loader"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute) or not re.match(r"_[^_]", node.attr):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if (name, node.attr) not in PRIVATE_REACH:
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


MODULE_CALLS = {
    "pq": {"ParquetFile", "read_schema", "read_metadata", "read_table", "write_table", "ParquetWriter"},
    "pa": {"memory_map", "OSFile", "input_stream", "output_stream"},
    "gzip": {"open"},
    "os": {"open", "fdopen", "stat", "lstat", "fstat", "replace", "rename", "remove", "unlink", "mkdir", "makedirs", "rmdir", "removedirs", "scandir", "listdir", "walk", "link", "symlink", "readlink", "truncate", "ftruncate", "pread", "fsync", "fdatasync", "copy_file_range", "chmod", "utime"},
    "shutil": None,
    "fcntl": None,
    "tempfile": None,
    "glob": {"glob", "iglob"},
}  # fmt: skip
"""Module functions that touch the file system (None: every function of the module)."""
OS_PATH = {"exists", "lexists", "isfile", "isdir", "islink", "ismount", "getsize", "getmtime", "realpath"}  # fmt: skip
PATH_METHODS = {"exists", "is_file", "is_dir", "is_symlink", "is_mount", "stat", "lstat", "iterdir", "glob", "rglob", "unlink", "mkdir", "rmdir", "touch", "write_text", "write_bytes", "read_text", "read_bytes", "resolve", "symlink_to", "chmod", "samefile"}  # fmt: skip
"""Methods of `pathlib.Path` that touch the file system (called with no arguments, or with
the arguments only a Path method takes, so `str.replace` and friends do not count)."""


SEAM = ("storage", "writing")
"""The names modules import packtool/storage/'s modules as."""


def _fs_calls(tree: ast.AST) -> list[str]:
    """Every call in `tree` that touches the file system itself."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            names = MODULE_CALLS.get(f.value.id, ())
            if names is None or f.attr in names:
                found.append(f"{f.value.id}.{f.attr}")
                continue
        if (
            isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Attribute)
            and isinstance(f.value.value, ast.Name)
            and (f.value.value.id, f.value.attr) == ("os", "path")
            and f.attr in OS_PATH
        ):
            found.append(f"os.path.{f.attr}")
            continue
        if isinstance(f, ast.Attribute) and f.attr in PATH_METHODS:
            keywords = {k.arg for k in node.keywords}
            if isinstance(f.value, ast.Name) and f.value.id in (*MODULE_CALLS, *SEAM):
                continue  # glob.glob, storage.glob: a module function (counted above if it is one)
            if f.attr == "resolve" and node.args:
                continue  # another object's resolve(names), e.g. a column table's
            if (
                not node.args
                or keywords & {"parents", "exist_ok", "missing_ok", "encoding", "recursive"}
                or f.attr in ("glob", "rglob")
            ):
                found.append(f".{f.attr}()")
                continue
        if (
            isinstance(f, ast.Attribute)
            and f.attr in ("rename", "replace")
            and len(node.args) == 1
            and not node.keywords
            and isinstance(node.args[0], (ast.Name, ast.Attribute, ast.BinOp))
        ):
            found.append(f".{f.attr}(target)")  # Path.rename / Path.replace (str.replace takes 2)
            continue
        if isinstance(f, ast.Name) and f.id == "open":
            found.append("open()")
    return found


def test_every_file_system_call_goes_through_the_storage_seam():
    # Object storage plugs in at packtool/storage/: a module that opened, listed, stat-ed,
    # renamed, removed or locked a file itself would be an operation that backend never sees.
    found = []
    for name, path in project_modules().items():
        if name.startswith(("packtool", "loader")) and not name.startswith("packtool.storage"):
            found += [
                f"{name}: {r}" for r in _fs_calls(ast.parse(path.read_text(encoding="utf-8")))
            ]
    assert not found, found


def test_the_file_system_check_sees_each_kind_of_call():
    code = (
        "pq.ParquetFile(p)\nopen(p)\nopen(p, 'wb')\np.read_text()\nos.replace(a, b)\n"
        "shutil.rmtree(p)\nfcntl.flock(fd, op)\nos.path.exists(p)\np.exists()\n"
        "p.stat().st_size\np.mkdir(parents=True)\np.unlink(missing_ok=True)\np.rename(q)\n"
        "sorted(p.glob('*.json'))\npq.write_table(t, p)\np.resolve()\nstorage.glob(p, '*')\n"
        "s.replace('a', 'b')\ncolumns.resolve(names)\nglob.has_magic(t)\nos.getpid()\n"
    )
    assert sorted(_fs_calls(ast.parse(code))) == sorted([
        "pq.ParquetFile", "open()", "open()", ".read_text()", "os.replace", "shutil.rmtree",
        "fcntl.flock", "os.path.exists", ".exists()", ".stat()", ".mkdir()", ".unlink()",
        ".rename(target)", ".glob()", "pq.write_table", ".resolve()",
    ])  # fmt: skip


@cache
def _packtool_modules_after(*steps: str) -> tuple[list[str], ...]:
    """The packtool modules loaded after each of `steps` (code), run one after another in one
    fresh interpreter: what the first loads is what it loads alone. (The loader's tests share
    one: `import loader` alone is ~3.5 s of CPU, torch's import.)"""
    show = "import sys as _sys\nprint(sorted(_sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", "\n".join(f"{step}\n{show}" for step in steps)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    lines = out.strip().splitlines()[-len(steps) :]
    return tuple([m for m in ast.literal_eval(line) if m.startswith("packtool")] for line in lines)


STUB_TRANSFORMERS = """
import importlib.abc, importlib.machinery, sys, types

class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "transformers":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def attribute(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {})

        module.__getattr__ = attribute
        return module

    def exec_module(self, module):
        pass

sys.meta_path.insert(0, _Stub())
"""
"""Makes `transformers` (and its submodules) an empty module whose every name is a class: the
loader's Trainer pieces (loader.hf.trainer, loader.hf.resume) subclass and import its names at
import time, and the real import (with the datasets and accelerate it pulls in) was ~6 of the
~11 CPU-s of `_loader_imports`' interpreter. transformers imports no packtool module, so the
packtool modules each loader module loads are the same; tests/loader/hf/ imports the real
one."""


def _loader_imports() -> tuple[list[str], ...]:
    """The packtool modules `import loader` loads, then those of every loader module but
    loader.testing (imported after it, in the same interpreter; transformers stubbed, see
    `STUB_TRANSFORMERS`)."""
    every = [m for m in project_modules() if m.startswith("loader") and m != "loader.testing"]
    return _packtool_modules_after(
        STUB_TRANSFORMERS + "import loader", "\n".join(f"import {m}" for m in every)
    )


def test_import_loader_loads_only_the_format_side():
    loaded, _ = _loader_imports()
    # 17 since packtool/storage/local_files.py came out of local.py (600 lines) with `open_size`;
    # 18 since the range cache's file form (block CRC32s) came out of storage/cache.py.
    assert len(loaded) <= 18, loaded
    assert not [m for m in loaded if m.startswith(NEVER_IN_TRAINING)]


def test_the_whole_loader_never_loads_a_tokenizer_or_the_cli():
    _, loaded = _loader_imports()
    assert not [m for m in loaded if m.startswith(NEVER_IN_TRAINING)], loaded
    assert "packtool.tokenize" not in loaded


@pytest.mark.parametrize("path", sorted((ROOT / "packtool").rglob("*.py")), ids=str)
def test_packtool_never_imports_torch_and_only_the_cli_imports_click(path):
    used = {m.split(".")[0] for m in imported_modules(path)}
    assert "torch" not in used
    if "cli" not in path.relative_to(ROOT).parts:
        assert "click" not in used


@pytest.mark.parametrize("path", sorted((ROOT / "attention").rglob("*.py")), ids=str)
def test_attention_takes_a_batch_dict_not_the_loader(path):
    assert not {m.split(".")[0] for m in imported_modules(path)} & {"loader", "packtool"}


@pytest.mark.parametrize("name", ["chunk.py", "kernels.py", "limits.py", "tail.py"])
def test_packing_is_pure(name):
    used = imported_modules(ROOT / "packtool" / "pack" / name)
    assert not used & {"pyarrow.parquet", "os", "pathlib", "shutil", "io"}


def test_the_architecture_test_sees_real_imports():
    # Guards the guard: the CLI does import click, the model does import torch.
    assert "click" in {m.split(".")[0] for m in imported_modules(ROOT / "packtool/cli/commands.py")}
    assert "torch" in {m.split(".")[0] for m in imported_modules(ROOT / "attention/model.py")}


@pytest.mark.parametrize(
    "path", [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))], ids=str
)
def test_modules_stay_small(path):
    # One concept per module, split before ~600 lines: along a seam inside the stage's folder,
    # where what is split off does not need the module it came from (no circle, above).
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= 600, f"{path.name} has {lines} lines; split it along a real seam"


def test_tests_mirror_the_tree():
    # tests/packtool/read/test_corpus.py tests packtool/read/corpus.py: every test folder under a
    # package is one of that package's stages.
    for folder in sorted((ROOT / "tests").glob("*/*/")):
        if folder.name.startswith((".", "_")) or folder.parts[-2] not in PACKAGES:
            continue
        assert (ROOT / folder.parts[-2] / folder.name / "__init__.py").is_file(), folder


def test_nothing_points_outside_the_repository():
    # The architecture lives in docs/architecture.md; the repo stands alone.
    outside = re.compile(r"\.\./shared|shared/DESIGN\.md|shared/STYLE\.md")
    found = []
    for path in [ROOT / "README.md", *ROOT.glob("*/**/*")]:
        text_file = path.suffix in (".py", ".md", ".sh", ".toml") and path.is_file()
        if text_file and ".venv" not in path.parts and outside.search(path.read_text("utf-8")):
            found.append(str(path.relative_to(ROOT)))
    assert not found, found


# benchmarks/gpu_check.sh runs on a GPU machine whose image has torch, numpy, pytest and
# hypothesis but none of packtool's own dependencies, and nothing can be installed there.
GPU_RUN = ("tests/attention/test_varlen_gpu.py", "benchmarks/bench_train.py", "tests/conftest.py")
GPU_IMAGE_HAS = {"torch", "numpy", "pytest", "hypothesis"}
# Imported behind a guard: without flash_attn the backend says it is missing; conftest.py's xdist
# scheduler is imported in a hook only pytest-xdist calls (the GPU run has no `-n`).
OPTIONAL = {"flash_attn", "xdist"}


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
