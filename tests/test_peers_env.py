"""scripts/gpu/peers_env.sh (sourced on the device): the carried parts of the CuTe-DSL peers wait in the site folder
until the last has come, the joined archive is extracted once, packages the interpreter already imports are left to
it, and the DSL's package folder goes on PYTHONPATH; scripts/gpu/peers_split.sh cuts the archive into those parts.
Run here with a stand-in archive and a temporary site folder."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "peers_env.sh"
SPLIT = SCRIPT.parent / "peers_split.sh"


def _archive(path: Path, files: dict[str, str | bytes]) -> None:
    with tarfile.open(path, "w:xz") as tar:
        for name, text in files.items():
            data = text.encode() if isinstance(text, str) else text
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _source(repo: Path, site: Path) -> tuple[str, str]:
    (repo / "peers_env.sh").write_text(SCRIPT.read_text())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HEARTH_SITE"] = str(site)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # python3 = this interpreter
    res = subprocess.run(["bash", "-uc", ". ./peers_env.sh && echo \"PYTHONPATH=$PYTHONPATH\""], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout, res.stderr


def _split(src: str, dest: Path, mib: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SPLIT), src, str(dest), mib], capture_output=True, text=True, timeout=60)


def _carry_only(repo: Path, parts: Path, name: str) -> None:
    """One device call's carry: .peers/ holds only this part."""
    peers = repo / ".peers"
    for f in peers.glob("peers.tar.xz.*"):
        f.unlink()
    (peers / name).write_bytes((parts / name).read_bytes())


@pytest.mark.skipif(sys.platform == "win32", reason="bash script")
def test_parts_wait_for_the_last_then_extract_once_and_the_dsl_folder_goes_on_the_path(tmp_path):
    repo, site, parts = tmp_path / "repo", tmp_path / "site", tmp_path / "parts"
    (repo / ".peers").mkdir(parents=True)
    # random bytes do not compress: the archive is about 3 MiB, so 1 MiB parts make three of them
    _archive(tmp_path / "peers.tar.xz", {
        "quack/__init__.py": "VERSION = 'stand-in'\n",
        "flash_attn/__init__.py": "", "flash_attn/cute/__init__.py": "",
        "nvidia_cutlass_dsl/dsl_packages/cutlass_standin/__init__.py": "",
        "nvidia_cutlass_dsl/big.bin": os.urandom(3 * 1024 * 1024),
        "einops/__init__.py": "raise ImportError('the image has its own einops')\n",
    })
    res = _split(str(tmp_path / "peers.tar.xz"), parts, "1")
    assert res.returncode == 0, res.stderr
    names = sorted(f.name for f in parts.iterdir())
    assert names == ["peers.tar.xz.1of4", "peers.tar.xz.2of4", "peers.tar.xz.3of4", "peers.tar.xz.4of4"], names
    assert max(f.stat().st_size for f in parts.iterdir()) <= 1024 * 1024
    # the parts join back into the archive, byte for byte
    joined = b"".join((parts / n).read_bytes() for n in names)
    assert joined == (tmp_path / "peers.tar.xz").read_bytes()
    # calls 1-3 (out of order): each part waits, nothing imports yet
    for i, name in enumerate(["peers.tar.xz.2of4", "peers.tar.xz.1of4", "peers.tar.xz.4of4"], start=1):
        _carry_only(repo, parts, name)
        out, _ = _source(repo, site)
        assert f"peers: {i} of 4 parts here" in out, out
        assert "peers: quack does not import" in out
    # call 4: the last part; the whole extracts
    _carry_only(repo, parts, "peers.tar.xz.3of4")
    out, _ = _source(repo, site)
    assert "peers: extracted 4 part(s)" in out, out
    assert "peers: quack imports" in out and "peers: flash_attn.cute imports" in out
    path = out.strip().splitlines()[-1].removeprefix("PYTHONPATH=").split(os.pathsep)
    assert path[0] == str(site) and str(site / "nvidia_cutlass_dsl" / "dsl_packages") in path
    assert (site / ".peers.done").exists() and not (site / ".peers-parts").exists()
    # a package the interpreter already imports (einops, where installed) is left to the interpreter's copy
    has_einops = subprocess.run([sys.executable, "-c", "import einops"], capture_output=True).returncode == 0
    assert (site / "einops").exists() is not has_einops
    # a later call on the same machine carrying a part again: nothing is extracted over what is there
    (site / "quack" / "__init__.py").write_text("VERSION = 'kept'\n")
    out, _ = _source(repo, site)
    assert "extracted" not in out and "parts here" not in out
    assert (site / "quack" / "__init__.py").read_text() == "VERSION = 'kept'\n"
    assert not (site / ".peers-parts").exists()  # nothing left behind once extracted


@pytest.mark.skipif(sys.platform == "win32", reason="bash script")
def test_parts_of_two_cuts_are_named_not_extracted(tmp_path):
    repo, site, parts = tmp_path / "repo", tmp_path / "site", tmp_path / "parts"
    (repo / ".peers").mkdir(parents=True)
    _archive(tmp_path / "a.tar.xz", {"quack/__init__.py": "", "big.bin": os.urandom(2 * 1024 * 1024)})
    assert _split(str(tmp_path / "a.tar.xz"), parts / "two", "2").returncode == 0
    assert _split(str(tmp_path / "a.tar.xz"), parts / "three", "1").returncode == 0
    assert sorted(f.name for f in (parts / "two").iterdir()) == ["peers.tar.xz.1of2", "peers.tar.xz.2of2"]
    (repo / ".peers" / "peers.tar.xz.1of2").write_bytes((parts / "two" / "peers.tar.xz.1of2").read_bytes())
    (repo / ".peers" / "peers.tar.xz.2of3").write_bytes((parts / "three" / "peers.tar.xz.2of3").read_bytes())
    out, err = _source(repo, site)
    assert "parts of two different cuts" in err and "extracted" not in out
    assert not (site / ".peers.done").exists()


@pytest.mark.skipif(sys.platform == "win32", reason="bash script")
def test_split_joins_the_two_archives_of_the_old_cut_and_names_a_bad_size(tmp_path):
    """Two archives given together (the fixed split of before) are joined into one set of parts that extracts whole;
    a bad part size is an error that names it."""
    repo, site, parts = tmp_path / "repo", tmp_path / "site", tmp_path / "parts"
    (repo / ".peers").mkdir(parents=True)
    _archive(tmp_path / "peers-1.tar.xz", {"nvidia_cutlass_dsl/big.bin": os.urandom(1024 * 1024)})
    _archive(tmp_path / "peers-2.tar.xz", {"quack/__init__.py": "VERSION = 2\n"})
    res = _split(f"{tmp_path / 'peers-1.tar.xz'} {tmp_path / 'peers-2.tar.xz'}", parts, "34")
    assert res.returncode == 0, res.stderr
    _carry_only(repo, parts, "peers.tar.xz.1of1")
    out, _ = _source(repo, site)
    assert "peers: extracted 1 part(s)" in out and "peers: quack imports" in out, out
    assert (site / "nvidia_cutlass_dsl" / "big.bin").stat().st_size == 1024 * 1024
    bad = _split(str(tmp_path / "peers-1.tar.xz"), parts, "0")
    assert bad.returncode == 2 and "PART_MIB" in bad.stderr


def _wheel(folder: Path, name: str) -> None:
    """A minimal pure-Python wheel of one module `name` (version 0.1) that pip installs offline."""
    import zipfile

    dist = f"{name}-0.1.dist-info"
    files = {f"{name}/__init__.py": "VALUE = 7\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: hearth-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name}-0.1-py3-none-any.whl", "w") as z:
        for n, text in files.items():
            z.writestr(n, text)


@pytest.mark.skipif(sys.platform == "win32", reason="bash script")
def test_carried_env_installs_the_carried_wheels_and_puts_src_first(tmp_path):
    """scripts/gpu/carried_env.sh, the top of every device script: hearth from src, the wheels under .whl/ installed
    into the site folder and on PYTHONPATH after src, and nothing else when no peers were carried."""
    repo, site = tmp_path / "repo", tmp_path / "site"
    (repo / ".whl").mkdir(parents=True)
    (repo / "scripts" / "gpu").mkdir(parents=True)
    (repo / "scripts" / "gpu" / "carried_env.sh").write_text((SCRIPT.parent / "carried_env.sh").read_text())
    _wheel(repo / ".whl", "hearth_carried_standin")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HEARTH_SITE"] = str(site)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    res = subprocess.run(["bash", "-uc", ". scripts/gpu/carried_env.sh && echo \"PYTHONPATH=$PYTHONPATH\" && "
                          "python3 -c 'import hearth_carried_standin as m; print(\"value\", m.VALUE)'"],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[-2] == f"PYTHONPATH=src:{site}" and lines[-1] == "value 7", res.stdout
    assert (site / "hearth_carried_standin" / "__init__.py").exists()
