"""scripts/setup-env's choice of where torch comes from (dry run: nothing is installed)."""
from __future__ import annotations

import os
import subprocess

import pytest

from suites.conftest import ROOT

SCRIPT = ROOT / "scripts" / "setup-env"


def _choice(tmp_path, **env) -> str:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("PIP_") and k not in ("TORCH_INDEX", "TORCH_SPEC", "FSDPC_ASSUME_GPU")}
    base.update(SETUP_ENV_DRY_RUN="1", PIP_CONFIG_FILE=os.devnull, **env)
    out = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "venv")], env=base,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "venv").exists()  # a dry run builds nothing
    return out.stderr


@pytest.mark.skipif(os.uname().sysname != "Linux" or os.uname().machine != "x86_64",
                    reason="the CUDA-by-default wheel is a Linux x86_64 matter")
def test_no_gpu_and_no_pip_index_gets_the_cpu_index(tmp_path):
    err = _choice(tmp_path, FSDPC_ASSUME_GPU="0")
    assert "from the PyTorch CPU index (https://download.pytorch.org/whl/cpu)" in err


@pytest.mark.parametrize("env,why", [
    ({"FSDPC_ASSUME_GPU": "1"}, "a GPU is present"),
    ({"FSDPC_ASSUME_GPU": "0", "PIP_INDEX_URL": "https://mirror.example/simple"},
     "pip has an index or find-links configured"),
    ({"FSDPC_ASSUME_GPU": "0", "TORCH_INDEX": "default"}, "TORCH_INDEX=default"),
])
def test_otherwise_pip_decides(tmp_path, env, why):
    err = _choice(tmp_path, **env)
    assert "from pip's configured/default index" in err and why in err


def test_an_index_url_is_used_as_given(tmp_path):
    err = _choice(tmp_path, TORCH_INDEX="https://mirror.example/torch")
    assert "torch==2.13.0 from https://mirror.example/torch" in err
