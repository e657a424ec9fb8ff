"""Object storage: `packtool pack` from `s3://` and from `s3://` to `s3://` against the same
files on disk, listing a prefix of 10^4 objects, ranged reads and uploads by library.

Run from the repository root: `python -m benchmarks.bench_remote [--mb 180] [--files 12]
[--objects 10000] [--latency-ms 20]` (a few minutes; needs the dev extras: moto's server, s3fs).
`--latency-ms` adds s3:// -> s3:// through the tests' proxy holding every request that long
(a real store's round trip, which loopback has not), and through it with no delay.

The S3 API server is moto's server mode on loopback, run as a process of its own (as a store is
a server of its own: it does not share the packing process's interpreter). moto is a Python
server, far slower per request than S3 itself, and it runs on the same cores as the pack, so the
figures bound what a real store costs from above on the request side, and say nothing about a
real network's bandwidth. The corpus (real text, benchmarks/real_corpus.py) is `--files` JSONL
files, as a corpus is stored in a bucket (a prefix of shards, not one object), put under a
prefix and kept in a local folder. Each case is one whole `packtool pack` process, as a user
runs it (imports, store clients and worker processes included), default options (a worker
process per core): local folder -> local, prefix -> local, prefix -> prefix; interleaved, best
of `--repeat`; the shards are compared byte for byte (s3 -> s3: the version the link
`index.json` names). The listing puts `--objects` small objects under one prefix and times
`storage.expand` of it (what `packtool pack s3://bucket/prefix/` does first). `packtool verify`
of the s3 -> s3 dataset and of the local one, one process each, interleaved, best of
`--repeat`.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import real_corpus
from benchmarks._common import ROOT, best_of, compile_sources, markdown_table, publish

DATA = ROOT / "bench_data"
GOAL_READ = 0.8


def _server() -> tuple[subprocess.Popen, str]:
    """moto's S3 server in a process of its own on a free loopback port, once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("moto's S3 server did not start") from None
            time.sleep(0.2)
    return server, f"http://127.0.0.1:{port}"


def _cpu_of(pid: int) -> float:
    """CPU seconds process `pid` has used (Linux's /proc), for the server's share."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(args: list[str], server: int, env: dict[str, str] | None = None) -> tuple[float, ...]:
    """One `packtool ARGS` process: (seconds, CPU seconds of its processes, CPU seconds of the
    server `server` meanwhile)."""
    cmd = [sys.executable, "-m", "packtool.cli", *args]
    before, served = resource.getrusage(resource.RUSAGE_CHILDREN), _cpu_of(server)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    seconds = time.perf_counter() - t0
    after, served = resource.getrusage(resource.RUSAGE_CHILDREN), _cpu_of(server) - served
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip()[-400:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return seconds, cpu, served


def _pack(
    source: str, out: Path | str, server: int, client: str, endpoint: str | None = None
) -> tuple[float, ...]:
    """One `packtool pack SOURCE -o OUT` process (max_len 4096, default options) through the S3
    client `client` (`PACKTOOL_S3_CLIENT`), to the server at `endpoint` (None: the server's own
    address; else the delaying proxy's)."""
    args = ["pack", source, "-o", str(out), "--max-len", "4096", "--overwrite"]
    env = {**os.environ, "PACKTOOL_S3_CLIENT": client}
    if endpoint is not None:
        env["AWS_ENDPOINT_URL"] = endpoint
    return _timed(args, server, env)


def _proxy(endpoint: str, latency_ms: float) -> tuple[subprocess.Popen, str]:
    """The tests' fault proxy (tests/packtool/storage/faulty_proxy.py) as a process of its own in
    front of `endpoint`, holding every request `latency_ms` before it forwards it (a real
    store's round trip), and its address."""
    proxy = subprocess.Popen(
        [sys.executable, "-m", "tests.packtool.storage.faulty_proxy", endpoint, str(latency_ms)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    return proxy, proxy.stdout.readline().strip()


def _verify(dataset: Path | str, server: int) -> tuple[float, ...]:
    """One `packtool verify DATASET` process. A bucket's shards are each downloaded once into
    the scratch folder and checked there (docs/verify-inspect.md)."""
    return _timed(["verify", str(dataset)], server)


def _split(corpus: Path, folder: Path, files: int) -> list[Path]:
    """`corpus` cut at line ends into `files` JSONL files of about equal size in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.jsonl"):
        old.unlink()
    data = corpus.read_bytes()
    paths, at = [], 0
    for i in range(files):
        cut = len(data) if i == files - 1 else data.find(b"\n", len(data) * (i + 1) // files) + 1
        cut = cut if cut > at else len(data)
        path = folder / f"part-{i:04d}.jsonl"
        path.write_bytes(data[at:cut])
        paths.append(path)
        at = cut
    return paths


def _ranged_reads(endpoint: str, key: str, size: int, block: int = 16 << 20) -> dict[str, float]:
    """Seconds to read object `key` of bucket `bench` once in `block`-byte ranged GETs, by
    each library that could sit under the storage seam (issue #25, item 7), best of 3."""
    import pyarrow.fs as pafs

    from packtool.storage import remote_read

    def with_packtool() -> None:
        for start in range(0, size, block):
            remote_read.read_range(f"s3://bench/{key}", start, min(size, start + block))

    def with_s3fs() -> None:
        import s3fs

        fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
        for start in range(0, size, block):
            fs.cat_file(f"bench/{key}", start=start, end=min(size, start + block))

    def with_pyarrow() -> None:
        fs = pafs.S3FileSystem(
            access_key="bench", secret_key="bench", region="us-east-1",
            endpoint_override=endpoint, scheme="http",
        )  # fmt: skip
        with fs.open_input_file(f"bench/{key}") as f:
            for start in range(0, size, block):
                f.read_at(min(block, size - start), start)

    def with_obstore() -> None:
        import obstore
        from obstore.store import S3Store

        store = S3Store(
            "bench", endpoint=endpoint, access_key_id="bench", secret_access_key="bench",
            region="us-east-1", client_options={"allow_http": True},
        )  # fmt: skip
        for start in range(0, size, block):
            obstore.get_range(store, key, start=start, end=min(size, start + block))

    return _each_library(
        {
            "packtool (storage.remote, obstore under it)": with_packtool,
            "s3fs (fsspec)": with_s3fs,
            "pyarrow.fs": with_pyarrow,
            "obstore": with_obstore,
        },
        3,
    )


def _each_library(runs: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best-of-`repeat` seconds of each library's run; a library not installed is left out."""
    out = {}
    for name, fn in runs.items():
        try:
            out[name] = best_of(fn, repeat)
        except ImportError:
            continue
    return out


def _shards(out: Path | str) -> dict[str, bytes]:
    if isinstance(out, str):  # a dataset in the bucket: the version its link names
        from packtool.dataset.manifest import dataset_folder
        from packtool.storage import local as storage

        folder = dataset_folder(out)
        return {p.name: storage.read_bytes(p) for p in storage.glob(folder, "shard-*.parquet")}
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}


def _uploads(endpoint: str, local: Path) -> dict[str, float]:
    """Seconds to upload the file `local` once as an object, by each library that could sit
    under the seam (item 7): packtool's (`remote_write.upload`: one PUT up to two 64 MiB
    parts' worth, through obstore), s3fs's `put_file` in the same parts, obstore's `put` (its
    default multipart), boto3's `upload_file` (8 MB parts on 10 threads); best of 2."""
    import boto3

    from packtool.storage import remote_write

    def with_packtool() -> None:
        remote_write.upload(local, "s3://bench/up/packtool.bin")

    def with_s3fs() -> None:
        import s3fs

        fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
        fs.put_file(
            str(local), "bench/up/s3fs.bin", chunksize=remote_write.part_size(local.stat().st_size)
        )

    def with_obstore() -> None:
        import obstore
        from obstore.store import S3Store

        store = S3Store(
            "bench", endpoint=endpoint, access_key_id="bench", secret_access_key="bench",
            region="us-east-1", client_options={"allow_http": True},
        )  # fmt: skip
        with local.open("rb") as f:
            obstore.put(store, "up/obstore.bin", f)

    def with_boto3() -> None:
        boto3.client("s3").upload_file(str(local), "bench", "up/boto3.bin")

    return _each_library(
        {
            "packtool (remote_write.upload, obstore under it)": with_packtool,
            "s3fs (packtool's parts)": with_s3fs,
            "obstore (its default parts)": with_obstore,
            "boto3": with_boto3,
        },
        2,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=180, help="MB of real text")
    ap.add_argument("--files", type=int, default=12, help="JSONL files the corpus is cut into")
    ap.add_argument("--objects", type=int, default=10_000, help="objects under the listed prefix")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--latency-ms", type=float, default=0,
        help="also pack s3:// -> s3:// through a proxy holding every request this long, and "
        "through the same proxy with no delay (what the proxy alone costs)",
    )  # fmt: skip
    ap.add_argument("--no-docs", action="store_true", help="print only")
    args = ap.parse_args()
    compile_sources()  # packtool's processes start from bytecode, as installed
    corpus = DATA / f"real_corpus_{args.mb}mb.jsonl"
    real_corpus.build(corpus, args.mb * 1_000_000)
    folder = DATA / f"remote_corpus_{args.mb}mb_{args.files}"
    parts = _split(corpus, folder, args.files)
    server, endpoint = _server()
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    try:
        _measure(args, corpus, folder, parts, endpoint, server.pid)
    finally:
        server.terminate()
        server.wait()


def _measure(
    args: argparse.Namespace,
    corpus: Path,
    folder: Path,
    parts: list[Path],
    endpoint: str,
    server: int,
) -> None:
    import boto3

    from packtool.storage import local as storage

    client = boto3.client("s3")
    client.create_bucket(Bucket="bench")
    for part in parts:
        client.upload_file(str(part), "bench", f"corpus/{part.name}")
    client.upload_file(str(corpus), "bench", f"whole/{corpus.name}")
    out = DATA / "remote"
    prefix = "s3://bench/corpus/"
    cases = {  # name: (input, output, S3 client)
        "local": (f"{folder}/", out / "local", "auto"),
        "s3": (prefix, out / "s3", "auto"),
        "s3s3": (prefix, "s3://bench/packed", "auto"),
        "s3-s3fs": (prefix, out / "s3-s3fs", "s3fs"),
        "s3s3-s3fs": (prefix, "s3://bench/packed-s3fs", "s3fs"),
    }
    proxies = {}
    if args.latency_ms:
        proxies = {
            "s3s3-proxy": _proxy(endpoint, 0),
            "s3s3-delayed": _proxy(endpoint, args.latency_ms),
        }
        for name in proxies:
            cases[name] = (prefix, f"s3://bench/{name}", "auto")
    best: dict[str, tuple[float, ...]] = {}
    try:
        for _ in range(args.repeat):
            for name, (source, target, how) in cases.items():
                via = proxies[name][1] if name in proxies else None
                got = _pack(source, target, server, how, via)
                best[name] = min(best.get(name, got), got)
    finally:
        for proxy, _ in proxies.values():
            proxy.terminate()
            proxy.wait()
    for name in cases.keys() - {"local"}:
        if _shards(cases[name][1]) != _shards(out / "local"):
            raise SystemExit(f"the shards of {name} differ from the local ones")
    checked: dict[str, tuple[float, ...]] = {}
    for _ in range(args.repeat):
        for name in ("local", "s3s3"):
            got = _verify(cases[name][1], server)
            checked[name] = min(checked.get(name, got), got)
    t0 = time.perf_counter()  # the server's ceiling: every object read once, as workers read
    for part in parts:
        with storage.open_input(f"{prefix}{part.name}") as f:
            while f.read(16 << 20):
                pass
    download = time.perf_counter() - t0
    size = corpus.stat().st_size
    libraries = _ranged_reads(endpoint, f"whole/{corpus.name}", size)
    imports = {  # what each process reading a bucket pays once, by S3 client
        name: best_of(lambda m=modules: subprocess.run([sys.executable, "-c", m], check=True), 3)
        - best_of(lambda: subprocess.run([sys.executable, "-c", "import upath"], check=True), 3)
        for name, modules in {
            "s3fs": "import s3fs, upath",
            "obstore": "import obstore.store, packtool.storage.s3_native, upath",
        }.items()
    }
    uploads = _uploads(endpoint, corpus)
    t0 = time.perf_counter()
    for i in range(args.objects):
        client.put_object(Bucket="bench", Key=f"many/part-{i:06d}.jsonl", Body=b'{"text": "x"}\n')
    put = time.perf_counter() - t0
    t0 = time.perf_counter()
    found = storage.expand(["s3://bench/many/"], (".jsonl",), ".jsonl")
    listing = time.perf_counter() - t0
    assert len(found) == args.objects
    mb = size / 1e6
    local = best["local"][0]
    read, both = local / best["s3"][0], local / best["s3s3"][0]

    def row(what: str, seconds: float, vs: str = "-", cpu: str = "-") -> list[str]:
        return [what, f"{seconds:.2f}", f"{mb / seconds:.1f}", vs, cpu]

    def pack_row(what: str, name: str) -> list[str]:
        seconds, cpu, served = best[name]
        return row(what, seconds, f"{local / seconds:.2f}x", f"{cpu:.2f} / {served:.2f}")

    def verify_row(what: str, name: str) -> list[str]:
        seconds, cpu, served = checked[name]
        vs = f"{checked['local'][0] / seconds:.2f}x"
        return [what, f"{seconds:.2f}", "-", vs, f"{cpu:.2f} / {served:.2f}"]

    rows = [
        pack_row("pack, local folder -> local", "local"),
        pack_row("pack, s3:// prefix -> local", "s3"),
        pack_row("pack, s3:// prefix -> s3://", "s3s3"),
        pack_row("pack, s3:// prefix -> local, `PACKTOOL_S3_CLIENT=s3fs`", "s3-s3fs"),
        pack_row("pack, s3:// prefix -> s3://, `PACKTOOL_S3_CLIENT=s3fs`", "s3s3-s3fs"),
    ]
    if args.latency_ms:
        rows += [
            pack_row("pack, s3:// prefix -> s3:// through the proxy, no delay", "s3s3-proxy"),
            pack_row(
                f"pack, s3:// prefix -> s3:// through the proxy, every request held "
                f"{args.latency_ms:g} ms",
                "s3s3-delayed",
            ),
        ]
    rows += [
        verify_row("verify the local dataset", "local"),
        verify_row("verify the s3:// dataset (each shard downloaded once)", "s3s3"),
        row("read every object once, 16 MB blocks (no packing)", download),
        [f"list a prefix of {args.objects:,} objects", f"{listing:.2f}", "-", "-", "-"],
    ]
    rows += [
        row(f"16 MB ranged reads of the whole corpus object, {n}", t) for n, t in libraries.items()
    ]
    rows += [row(f"upload the whole corpus object once, {n}", t) for n, t in uploads.items()]
    table = markdown_table(
        ["what", "seconds", "MB/s of input", "speed vs local", "CPU-s: packtool / server"], rows
    )
    own = best["s3s3"][1] / best["local"][1]
    delayed = ""
    if args.latency_ms:
        held, plain = best["s3s3-delayed"][0], best["s3s3-proxy"][0]
        delayed = (
            f"Through the tests' proxy (a Python process forwarding every byte, on the same cores) "
            f"with every request held {args.latency_ms:g} ms, as a real store's round trip: "
            f"s3:// -> s3:// {local / held:.2f}x local, against {local / plain:.2f}x through the "
            f"proxy with no delay: the round trips cost {held - plain:.2f} s of the run.\n\n"
        )
    body = (
        f"Object storage (`python -m benchmarks.bench_remote`, {time.strftime('%Y-%m-%d')}, "
        f"best of {args.repeat}, interleaved): {mb:.0f} MB of real text in {len(parts)} JSONL "
        "files, packed (max_len 4096, default options: a worker process per core) by whole "
        "`packtool pack` processes from a prefix on moto's S3 server (a process of its own, on "
        "loopback, on the same 2 cores) and from the same files on disk; shards byte-identical "
        f"(checked in the run, every case). s3:// -> local runs at **{read:.2f}x** local -> "
        f"local, s3:// -> s3:// at **{both:.2f}x** (goal {GOAL_READ}x: "
        f"{'met' if both >= GOAL_READ else 'missed'}), through obstore (packtool/storage/"
        "s3_native.py, the client an S3-compatible endpoint gets); through s3fs (the client "
        "of AWS itself, and of credentials from a profile) "
        f"{local / best['s3-s3fs'][0]:.2f}x and {local / best['s3s3-s3fs'][0]:.2f}x. What the "
        "gap is made of (last column: CPU seconds of packtool's processes, and of the server "
        "meanwhile): the server works on the same two cores the pack uses "
        f"({best['s3s3'][2]:.2f} CPU-s for s3:// -> s3://); packtool's own processes spend "
        f"{own:.2f}x the CPU of the local run. Importing the client, once per process that "
        f"touches a bucket: s3fs {imports['s3fs']:.2f} s, obstore {imports['obstore']:.2f} s "
        "(a process, less one that imports upath alone). Every object read once, with no "
        f"packing: {download:.2f} s. Listing {args.objects:,} objects: {listing:.2f} s "
        f"({args.objects / listing:,.0f} keys/s; putting them took {put:.0f} s). moto copies "
        "the whole object for every ranged GET, so a corpus of one large object reads slower "
        "from it than from a real store. Ranged reads of one object (16 MB GETs) and uploads "
        "of one object, by library, are the last rows. `packtool verify` of the s3:// dataset "
        f"(its {len(_shards(out / 'local'))} shard(s) downloaded once each into the scratch "
        f"folder, then checked as files) runs at {checked['local'][0] / checked['s3s3'][0]:.2f}x "
        "the local dataset's (one process each; the speed column says so for verify rows).\n\n"
        f"{delayed}{table}"
    )
    publish("remote", body, docs=not args.no_docs)


if __name__ == "__main__":
    main()
