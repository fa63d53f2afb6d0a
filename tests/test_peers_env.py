"""scripts/gpu/peers_env.sh (sourced on the device): each carried part of the CuTe-DSL peers is extracted once into
the site folder, packages the interpreter already imports are left to it, and the DSL's package folder goes on
PYTHONPATH. Run here with a stand-in archive and a temporary site folder."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "peers_env.sh"


def _archive(path: Path, files: dict[str, str]) -> None:
    with tarfile.open(path, "w:xz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _source(repo: Path, site: Path) -> tuple[str, str]:
    (repo / "peers_env.sh").write_text(SCRIPT.read_text())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HEARTH_SITE"] = str(site)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # python3 = this interpreter
    res = subprocess.run(["bash", "-c", ". ./peers_env.sh && echo \"PYTHONPATH=$PYTHONPATH\""], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout, res.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="bash script")
def test_parts_extract_once_and_the_dsl_folder_goes_on_the_path(tmp_path):
    repo, site = tmp_path / "repo", tmp_path / "site"
    (repo / ".peers").mkdir(parents=True)
    _archive(repo / ".peers" / "peers-2.tar.xz", {
        "quack/__init__.py": "VERSION = 'stand-in'\n",
        "nvidia_cutlass_dsl/dsl_packages/cutlass_standin/__init__.py": "",
        "einops/__init__.py": "raise ImportError('the image has its own einops')\n",
    })
    out, _ = _source(repo, site)
    assert "peers: extracted .peers/peers-2.tar.xz" in out
    assert "peers: quack imports" in out and "peers: flash_attn.cute does not import" in out
    path = out.strip().splitlines()[-1].removeprefix("PYTHONPATH=").split(os.pathsep)
    assert path[0] == str(site) and str(site / "nvidia_cutlass_dsl" / "dsl_packages") in path
    assert (site / ".peers-2.tar.xz.done").exists()
    # a package the interpreter already imports (einops, where installed) is left to the interpreter's copy
    has_einops = subprocess.run([sys.executable, "-c", "import einops"], capture_output=True).returncode == 0
    assert (site / "einops").exists() is not has_einops
    # a second call on the same machine with the other part: part 2 is not extracted again
    (repo / ".peers" / "peers-2.tar.xz").unlink()
    _archive(repo / ".peers" / "peers-1.tar.xz", {"flash_attn/__init__.py": "", "flash_attn/cute/__init__.py": ""})
    (site / "quack" / "__init__.py").write_text("VERSION = 'kept'\n")
    out, _ = _source(repo, site)
    assert "extracted .peers/peers-1.tar.xz" in out and "peers-2" not in out
    assert "peers: quack imports" in out and "peers: flash_attn.cute imports" in out
    assert (site / "quack" / "__init__.py").read_text() == "VERSION = 'kept'\n"


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
