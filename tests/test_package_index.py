"""tests/package_index.py with the real clients: the wheels it writes are valid and reproducible, and uv
and pip resolve, lock (with hashes) and install from its index, seeing releases as they are published
and unpublished while it serves. Loopback only: no mocks, no other index, no shared caches."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest
from uv import find_uv_bin

from package_index import PackageIndex, build_wheel, package_index_fixture  # noqa: F401

UV = find_uv_bin()


def greeting(version: str) -> dict[str, str]:
    return {"greeting/__init__.py": f'VERSION = "{version}"\ndef hello(): return "hello {version}"\n'}


def clean_env(tmp_path: Path) -> dict[str, str]:
    """This machine's pip and uv settings left out (find-links, extra indexes), a cache of the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_", "VIRTUAL_ENV"))}
    return {
        **env,
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
        "UV_NO_CONFIG": "1",
        "UV_PYTHON_DOWNLOADS": "never",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def run(*args: str | Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120, check=False
    )
    assert result.returncode == 0, f"{args} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def compile_lock(index: PackageIndex, tmp_path: Path, name: str) -> str:
    requirements = tmp_path / "requirements.in"
    requirements.write_text("greeting\n")
    lock = tmp_path / name
    run(
        UV, "pip", "compile", requirements, "-o", lock, "--index-url", index.url, "--generate-hashes",
        "--no-header", "--python", sys.executable, "--quiet",
        env=clean_env(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    return lock.read_text()


def pins(lock: str) -> dict[str, list[str]]:
    """name==version → its hashes, from a hash lock."""
    joined = lock.replace("\\\n", " ")
    return {
        m.group(1): re.findall(r"--hash=sha256:([0-9a-f]{64})", m.group(2))
        for m in re.finditer(r"^(\S+==\S+)(.*)$", joined, re.MULTILINE)
    }


def venv_python(tmp_path: Path, name: str) -> Path:
    venv = tmp_path / name
    run(UV, "venv", venv, "--python", sys.executable, "--quiet", env=clean_env(tmp_path), cwd=tmp_path)
    return venv / "bin" / "python"


def hello(python: Path, tmp_path: Path) -> str:
    return run(
        python,
        "-c",
        "import greeting; print(greeting.hello(), greeting.VERSION)",
        env=clean_env(tmp_path),
        cwd=tmp_path,
    ).stdout.strip()


def test_wheels_are_valid_and_reproducible(tmp_path: Path) -> None:
    modules = {**greeting("1.0"), "greeting/data/words.txt": "hi\n"}
    first = build_wheel(tmp_path / "a", "Greeting.Words", "1.0", modules, ["other-thing>=1"])
    again = build_wheel(tmp_path / "b", "Greeting.Words", "1.0", modules, ["other-thing>=1"])
    assert first.name == "greeting_words-1.0-py3-none-any.whl"
    assert first.read_bytes() == again.read_bytes()
    assert (
        first.read_bytes()
        != build_wheel(tmp_path / "c", "Greeting.Words", "1.0", greeting("1.1")).read_bytes()
    )

    with zipfile.ZipFile(first) as wheel:
        assert wheel.testzip() is None
        assert all(info.date_time == (1980, 1, 1, 0, 0, 0) for info in wheel.infolist())
        dist_info = "greeting_words-1.0.dist-info"
        metadata = wheel.read(f"{dist_info}/METADATA").decode()
        assert metadata.splitlines() == [
            "Metadata-Version: 2.1", "Name: Greeting.Words", "Version: 1.0", "Requires-Dist: other-thing>=1",
        ]  # fmt: skip
        assert "Root-Is-Purelib: true" in wheel.read(f"{dist_info}/WHEEL").decode()
        assert "Tag: py3-none-any" in wheel.read(f"{dist_info}/WHEEL").decode()
        record = wheel.read(f"{dist_info}/RECORD").decode().splitlines()
        assert sorted(line.split(",")[0] for line in record) == sorted(wheel.namelist())
        for line in record:
            path, digest, size = line.split(",")
            if path.endswith("/RECORD"):
                assert (digest, size) == ("", "")
                continue
            data = wheel.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={expected}", len(data))

    for bad in ("/abs.py", "../up.py", "greeting_words-1.0.dist-info/x"):
        with pytest.raises(ValueError):
            build_wheel(tmp_path / "d", "Greeting.Words", "1.0", {bad: ""})


def test_pages_follow_publish_and_unpublish(package_index: PackageIndex) -> None:
    wheel = package_index.publish("Polite_Words", "2.0", {"polite_words.py": "PLEASE = 1\n"})
    page = urllib.request.urlopen(package_index.url + "polite-words/").read().decode()
    sha = package_index.sha256("polite.words", "2.0")
    assert f'href="../../files/{wheel.name}#sha256={sha}"' in page
    assert 'data-core-metadata="sha256=' in page
    metadata = urllib.request.urlopen(package_index.base_url + f"files/{wheel.name}.metadata").read()
    assert f'data-core-metadata="sha256={hashlib.sha256(metadata).hexdigest()}"' in page
    assert b"Name: Polite_Words\n" in metadata
    assert (
        '<a href="polite-words/">Polite_Words</a>'
        in urllib.request.urlopen(package_index.url).read().decode()
    )

    package_index.unpublish("polite-words", "2.0")
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(package_index.url + "polite-words/")
    assert "polite-words" not in urllib.request.urlopen(package_index.url).read().decode()
    assert not wheel.exists()
    assert package_index.requests[:2] == ["/simple/polite-words/", f"/files/{wheel.name}.metadata"]


def test_uv_locks_and_installs_and_pip_installs(package_index: PackageIndex, tmp_path: Path) -> None:
    package_index.publish("greeting", "1.0", greeting("1.0"))
    lock = compile_lock(package_index, tmp_path, "lock-1.0.txt")
    assert pins(lock) == {"greeting==1.0": [package_index.sha256("greeting", "1.0")]}
    # uv took the metadata PEP 658 offers, not the wheel, to resolve
    assert package_index.fetched("greeting-1.0-py3-none-any.whl.metadata")
    assert not package_index.fetched("greeting-1.0-py3-none-any.whl")

    # a new release, with a dependency, while the index serves (and with uv's cache still warm)
    package_index.publish("Polite.Words", "2.0", {"polite_words.py": "PLEASE = 1\n"})
    package_index.publish("greeting", "1.1", greeting("1.1"), requires=["polite-words>=2"])
    lock = compile_lock(package_index, tmp_path, "lock-1.1.txt")
    assert pins(lock) == {
        "greeting==1.1": [package_index.sha256("greeting", "1.1")],
        "polite-words==2.0": [package_index.sha256("polite-words", "2.0")],
    }

    python = venv_python(tmp_path, "uv-venv")
    package_index.requests.clear()
    run(
        UV, "pip", "install", "--require-hashes", "-r", tmp_path / "lock-1.1.txt",
        "--index-url", package_index.url, "--python", python, "--quiet",
        env=clean_env(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert hello(python, tmp_path) == "hello 1.1 1.1"
    assert package_index.fetched("/files/greeting-1.1-py3-none-any.whl")
    assert package_index.fetched("/files/polite_words-2.0-py3-none-any.whl")

    # pip, with this machine's configuration ignored, into a venv of its own
    pip_python = venv_python(tmp_path, "pip-venv")
    package_index.requests.clear()
    run(
        sys.executable, "-m", "pip", "--isolated", "--python", pip_python, "install", "--quiet",
        "--index-url", package_index.url, "--no-deps", "greeting==1.0",
        env=clean_env(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert hello(pip_python, tmp_path) == "hello 1.0 1.0"
    assert package_index.fetched("/files/greeting-1.0-py3-none-any.whl")

    # unpublished: neither resolves it any more
    package_index.unpublish("greeting", "1.1")
    assert pins(compile_lock(package_index, tmp_path, "lock-after.txt")) == {
        "greeting==1.0": [package_index.sha256("greeting", "1.0")]
    }


def test_a_wheel_for_a_newer_glibc_locks_only_for_a_platform_that_has_it(
    package_index: PackageIndex, tmp_path: Path
) -> None:
    """An index holding one wheel per release, tagged for glibc 2.31 (as a wheelhouse of this
    machine's downloads holds tensorboard-data-server): the lock for Debian 12's VMs (glibc 2.36)
    takes it; a platform of unknown glibc (2.28, the conservative default) cannot."""
    from dlinfra.environment.lock import Platform, _uv_glibc
    from dlinfra.images.vm import VM_PLATFORM

    package_index.publish("native", "1.0", {"native.py": "X = 1\n"}, tag="py3-none-manylinux_2_31_x86_64")
    requirements = tmp_path / "requirements.in"
    requirements.write_text("native\n")

    def lock_for(target: Platform) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [UV, "pip", "compile", requirements, "--index-url", package_index.url, "--generate-hashes",
             "--no-header", "--quiet", "--python-version", target.python, "--python-platform", target.uv],
            env=clean_env(tmp_path), cwd=tmp_path, capture_output=True, text=True,
        )  # fmt: skip

    assert VM_PLATFORM.uv == "x86_64-manylinux_2_36"
    on_vm = lock_for(VM_PLATFORM)
    assert on_vm.returncode == 0, on_vm.stderr
    assert "native==1.0" in on_vm.stdout
    unknown = lock_for(Platform("3.11", "x86_64"))
    assert unknown.returncode != 0 and "manylinux_2_28" in unknown.stderr, unknown.stderr
    # this machine's glibc, clamped to the tags uv knows (2.17 to 2.40)
    assert [_uv_glibc(v) for v in ("2.36", "2.12", "2.41", "2", "3.1")] == [
        "2.36",
        "2.17",
        "2.40",
        "2.17",
        "2.28",
    ]
