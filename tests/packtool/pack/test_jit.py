"""Lazy kernels (packtool/pack/jit.py): the packer's modules import without numba, the first call
turns every kernel into its dispatcher, and `packtool pack` starts encoding before numba loads."""

from __future__ import annotations

import subprocess
import sys

from tests.packtool import tokenizer_shapes


def _run(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_packer_and_the_cli_import_without_numba():
    code = (
        "import sys\n"
        "import packtool.cli.commands, packtool.engines.local, packtool.engines.worker\n"
        "import packtool.pack.chunk, packtool.pack.warmup, packtool.stats.lengths\n"
        "print('numba' in sys.modules)\n"
        "from packtool.pack import kernels\n"
        "import numpy as np\n"
        "print(kernels.ffd_assign(np.array([3, 2, 1]), 4)[2], 'numba' in sys.modules)\n"
        "print(type(kernels._decreasing).__name__)\n"
    )
    assert _run(code) == ["False", "2", "True", "CPUDispatcher"]


def test_pack_encodes_its_first_batch_before_numba_is_imported(tmp_path):
    # The start-up order this module exists for: a partition loads its kernels only once it
    # reads, so numba's import never delays the tokenizer's build or the first encode.
    tokenizer = tokenizer_shapes.build("gpt2", tmp_path / "tok")
    code = (
        "import sys\n"
        "from packtool.tokenizer import tokenizers\n"
        "seen = []\n"
        "start = tokenizers.Tokenizer.start_batch\n"
        "def spy(self, texts):\n"
        "    seen.append('numba' in sys.modules)\n"
        "    return start(self, texts)\n"
        "tokenizers.Tokenizer.start_batch = spy\n"
        "from packtool.cli import commands\n"
        f"sys.argv = ['packtool', 'pack', 'sample_data/corpus.jsonl', '-o', {str(tmp_path / 'o')!r},"
        f" '--max-len', '512', '--tokenizer', {str(tokenizer)!r}, '--workers', '1']\n"
        "try:\n"
        "    commands.main()\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "print(len(seen), seen[0], 'numba' in sys.modules)\n"
    )
    batches, numba_at_first_batch, numba_at_end = _run(code)[-3:]
    assert int(batches) >= 1 and numba_at_first_batch == "False" and numba_at_end == "True"


def test_kernels_give_the_reference_results_after_a_racing_first_call():
    # Four threads of a fresh process make the first call at once: the lock turns the kernels
    # once, and every thread gets the reference's assignment.
    code = (
        "import threading, numpy as np\n"
        "from packtool.pack import kernels, reference\n"
        "lengths = np.random.default_rng(0).integers(1, 100, 500)\n"
        "want = reference.ffd_reference(lengths.tolist(), 128)\n"
        "got = []\n"
        "def call():\n"
        "    got.append(kernels.ffd_assign(lengths, 128))\n"
        "threads = [threading.Thread(target=call) for _ in range(4)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(len(got), all(r.tolist() == want[0] and o.tolist() == want[1] and n == want[2]"
        " for r, o, n in got))\n"
    )
    assert _run(code) == ["4", "True"]


def test_kernels_that_call_each_other_turn_together_and_later_ones_are_dispatchers_at_once():
    code = (
        "import sys\n"
        "from packtool.pack import jit\n"
        "@jit.njit(cache=False)\n"
        "def inner(x):\n"
        "    return x + 1\n"
        "@jit.njit(cache=False)\n"
        "def outer(x):\n"
        "    return inner(x) * 2\n"
        "print(type(outer).__name__, jit.loaded(), 'numba' in sys.modules)\n"
        "print(outer(20), type(outer).__name__, type(inner).__name__, jit.loaded())\n"
        "@jit.njit(cache=False)\n"
        "def later(x):\n"
        "    return inner(x) - 1\n"
        "print(type(later).__name__, later(5))\n"
    )
    assert _run(code) == [
        *("LazyKernel", "False", "False"),
        *("42", "CPUDispatcher", "CPUDispatcher", "True"),
        *("CPUDispatcher", "5"),
    ]


def test_kernels_compile_without_a_cache_where_numba_has_no_folder_to_keep_one(tmp_path):
    # packtool installed read-only and no writable ~/.cache (a container run as another user):
    # numba finds no cache locator and refuses `cache=True` with a RuntimeError, which was a
    # traceback at the first pack. Emptying numba's locator list is that case, even as root.
    # The mixture kernel (packtool/mixture/deficit.py) compiled at import, and failed the same.
    code = (
        "import sys\n"
        "from numba.core import caching\n"
        "caching.CacheImpl._locator_classes = []\n"
        "from packtool.cli import commands\n"
        f"sys.argv = ['packtool', 'pack', 'sample_data/corpus.jsonl', '-o', {str(tmp_path / 'o')!r},"
        " '--max-len', '512', '--workers', '1']\n"
        "try:\n"
        "    commands.main()\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "import numpy as np\n"
        "from packtool.mixture import deficit\n"
        "one = np.ones(1, np.int64)\n"
        "src = deficit.mix_kernel(np.ones(1), one * 0, one * 5, one * 0, one, one * -1,"
        " tokens_mode=False, max_units=1, tokens_left=10, n_out=1)[0]\n"
        "print(src.tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("note: numba finds no writable folder") == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert (tmp_path / "o" / "index.json").is_file()
    assert out.stdout.split()[-1] == "[0]"
