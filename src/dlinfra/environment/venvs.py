"""Local nodes run in a virtual environment made from the run's lock, not in the CLI's own: a local
run and a cloud run of one experiment run the same versions, and a user's requirement never lands
in the CLI's environment.

An environment is keyed by its lock (and the interpreter that made it) and shared by every run of
this machine with that lock. The run's own dlinfra is not in it: a checkout's wheel changes with
every edit, and a new environment per wheel cost a new compile of TensorFlow each time. The wheel
is unpacked beside it instead, once per wheel (`code/<sha256>`), and put first on the nodes'
PYTHONPATH: what `pip install` of it into the environment would give, for a third of a second.

Both are made from uv's cache, whose files uv hard-links into every environment, the CLI's own
included. Bytecode is what costs (TensorFlow's lock: 8.5 s of compiling on two cores): a file that
is the very file the CLI's environment holds gets that environment's bytecode of it, checked
against its source; only the rest is compiled (BENCHMARKS.md, "A run's environment").
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from dlinfra.environment.lock import Index, Lock, uv, uv_environ
from dlinfra.errors import DlinfraError

# A package's own test suite: no training run imports it, and one that did compiles it in memory
UNIMPORTED = frozenset({"tests"})  # not `test`: TensorFlow imports its tf.test API from such dirs
DONE = "dlinfra-env.json"  # written last: an environment without it is half made and made again
# Compiles the files named on stdin, one per line, as they come: across the cores, or here alone
# (`few`: a pool's start costs more than it saves). A file that does not compile is left to the
# interpreter to refuse at import, as uv's --compile-bytecode leaves it.
COMPILE = """
import compileall, functools, sys
from concurrent.futures import ProcessPoolExecutor
files = (line.rstrip("\\n") for line in sys.stdin)
one = functools.partial(compileall.compile_file, quiet=2)
if sys.argv[1:] == ["few"]:
    list(map(one, files))
else:
    with ProcessPoolExecutor() as pool:
        list(pool.map(one, files, chunksize=16))
"""


def cache_home() -> Path:
    """$DLINFRA_CACHE, else $XDG_CACHE_HOME/dlinfra (~/.cache/dlinfra): keyed by content, shared."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("DLINFRA_CACHE") or Path(base) / "dlinfra").absolute()


def key(lock: Lock) -> str:
    interpreter = f"{os.path.realpath(sys.executable)}\0{sys.version}"
    return hashlib.sha256(f"{lock.sha256}\0{interpreter}".encode()).hexdigest()[:20]


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


def ensure(lock: Lock, index: Index) -> Path:
    """The environment of `lock`, made once per machine."""
    env = cache_home() / "envs" / key(lock)
    _once(env, lambda: _make(env, lock, index), {"lock_sha256": lock.sha256, "packages": lock.pins()})
    return env


def code(wheel: Path, sha256: str) -> Path:
    """The run's dlinfra `wheel` unpacked and compiled, for the PYTHONPATH: by this interpreter, the
    one every environment is made from, so it needs none of them (it is made beside one)."""
    out = cache_home() / "code" / sha256[:20]

    def unpack() -> None:
        step = [uv(), "pip", "install", "--quiet", "--no-deps", "--python", sys.executable,
                "--target", str(out), str(wheel)]  # fmt: skip
        _run(step, dict(os.environ, NO_COLOR="1"), out, f"Fix: the wheel {wheel} must install")
        files = [str(p) for p in out.rglob("*.py")]
        _compile(Path(sys.executable), files, few=len(files) < 200)

    _once(out, unpack, {"wheel_sha256": sha256})
    return out


def _once(path: Path, make: Callable[[], None], record: dict[str, object]) -> None:
    """`make` `path` unless a whole one is there; two deploys at once make it once."""
    if (path / DONE).is_file():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f"{path.name}.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if (path / DONE).is_file():
            return
        shutil.rmtree(path, ignore_errors=True)
        make()
        (path / DONE).write_text(json.dumps(record, indent=1), encoding="utf-8")


def _make(env: Path, lock: Lock, index: Index) -> None:
    with tempfile.TemporaryDirectory(prefix="dlinfra-env-") as tmp:
        scratch = Path(tmp)
        (scratch / "env.lock").write_text(lock.text, encoding="utf-8")
        environ = uv_environ(index, scratch)
        python = str(python_of(env))
        fix = f"Fix: check that the package index ({index.shown()}) is reachable and holds every locked file"
        _run([uv(), "venv", "--quiet", "--python", sys.executable, str(env)], environ, env, fix)
        _run([uv(), "pip", "sync", "--quiet", "--python", python, "--require-hashes", *index.uv_args(),
              str(scratch / "env.lock")], environ, env, fix)  # fmt: skip
    # Compiled once, here: uv writes no bytecode, and where PYTHONDONTWRITEBYTECODE is set no node
    # ever would, so every trainer compiled TensorFlow's ~2000 modules again (measured: its import
    # 15.4 CPU-s against 5.8; a 5-node local run 52 -> 38 CPU-s, for about 50 CPU-s once here).
    # The compiler's workers start on the first file the walk leaves, not after the walk.
    site = _site_packages(env)
    _compile(python_of(env), _seed_bytecode(site, Path(sysconfig.get_paths()["purelib"])), few=False)


def _run(step: list[str], environ: dict[str, str], made: Path, fix: str) -> None:
    result = subprocess.run(step, capture_output=True, text=True, env=environ)
    if result.returncode != 0:
        raise DlinfraError(
            f"could not make the run's environment in {made} ({' '.join(step[1:3])}): "
            f"{result.stderr.strip()[-1500:]}\n{fix}"
        )


def _site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _seed_bytecode(site: Path, donor: Path) -> Iterator[str]:
    """Link into `site` the donor's bytecode of every source that is the donor's own file (one inode:
    the same bytes) and whose bytecode was compiled from it; the sources left are yielded. Packages'
    own test suites are skipped (a third of what a fresh lock left to compile: numpy's tests)."""
    for folder, dirs, files in os.walk(site):
        dirs[:] = [d for d in dirs if d not in UNIMPORTED]
        for name in files:
            if not name.endswith(".py"):
                continue
            source = os.path.join(folder, name)
            cached = importlib.util.cache_from_source(source)
            theirs = os.path.join(donor, os.path.relpath(cached, site))
            try:
                if _compiled_from(source, os.path.join(donor, os.path.relpath(source, site)), theirs):
                    os.makedirs(os.path.dirname(cached), exist_ok=True)
                    _link_or_copy(theirs, cached)
                    continue
            except OSError:
                pass  # no such file there, or unreadable: compiled here
            yield source


def _compiled_from(source: str, twin: str, bytecode: str) -> bool:
    """Whether `bytecode` is valid for `source`: `twin` is `source` itself, and the bytecode's
    header (PEP 552: magic, timestamp-checked, the source's mtime and size) names it."""
    mine, theirs = os.stat(source), os.stat(twin)
    if (mine.st_ino, mine.st_dev) != (theirs.st_ino, theirs.st_dev):
        return False
    with open(bytecode, "rb") as f:
        header = f.read(16)
    stamp = (int(mine.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
    size = (mine.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    return header == importlib.util.MAGIC_NUMBER + bytes(4) + stamp + size


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except FileExistsError:
        pass
    except OSError:  # another file system: a copy, as good
        shutil.copyfile(source, target)


def _compile(python: Path, files: Iterable[str], few: bool) -> None:
    """Compile `files` with `python`, each handed over as soon as it is named."""
    with tempfile.TemporaryFile("w+") as errors:  # a file, not a pipe: nothing blocks on it
        compiler = subprocess.Popen(
            [python, "-c", COMPILE, *(["few"] if few else [])],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors, text=True, bufsize=1,
        )  # fmt: skip
        assert compiler.stdin is not None
        try:
            for path in files:
                compiler.stdin.write(f"{path}\n")
        except BrokenPipeError:
            pass  # it stopped: its exit status and message say why
        finally:
            with contextlib.suppress(BrokenPipeError):
                compiler.stdin.close()
            code = compiler.wait()
        if code != 0:
            errors.seek(0)
            raise DlinfraError(
                f"could not compile the bytecode of {python.parent.parent}: {errors.read().strip()[-1500:]}\n"
                "Fix: remove that directory; the next deploy makes it again"
            )
