#!/usr/bin/env bash
# Create (once) a virtual environment with a chosen torch, then this package and its extras.
#
#   scripts/setup-env [VENV_DIR]          VENV_DIR defaults to .venv
#   TORCH_SPEC="torch==2.15.0" scripts/setup-env .venv-2.15
#
# Rules
# - torch is installed *first*, from TORCH_SPEC (default torch==2.13.0, the local CPU wheel on
#   this machine kind), so pip never resolves the package's bare `torch` requirement to the
#   newest multi-GB CUDA build on a CPU machine.
# - numpy is always installed (object collectives need it; torch does not pull it).
# - The trainers the examples run (the `trainers` extra: accelerate, torchtitan, lightning)
#   are installed with the installed torch pinned (a pip constraint), so pip can never
#   replace torch for them (torchtitan 0.3.0 pulled torch 2.15.0 into a torch 2.8.0
#   environment before this rule). Where they need another torch, the set-up says so and
#   goes on without them for a non-default torch (a gate environment runs no examples);
#   for the default torch (torch==2.13.0) it fails: `make test` runs the examples.
# - The environment is rebuilt only when TORCH_SPEC or pyproject.toml changed (stamp file).
# - Where torch comes from (TORCH_INDEX: auto (default), cpu, default, or an index URL): on
#   Linux x86_64 the default index's torch is the multi-GB CUDA build. With auto, a machine
#   without a GPU (no working `nvidia-smi -L`, no /dev/nvidia0) whose pip has no index or
#   find-links configured (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, `pip config`)
#   gets the CPU build from the PyTorch CPU index, falling back to the default index if that
#   index cannot be reached; anywhere else pip's own configuration decides. The choice is
#   printed before anything is downloaded. SETUP_ENV_DRY_RUN=1 prints it and stops.
# - Where this package comes from: in a clone (a pyproject.toml two folders up) it is
#   installed editable with its extras, from the clone; from an installed package (the gate
#   run by a user who pip-installed it) its dependencies are installed and the package's own
#   files are copied into the environment (a .pth file points there): no clone needed.
set -euo pipefail
pkg="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
here="$(cd "$pkg/.." && pwd)"
if [ -f "$here/pyproject.toml" ]; then clone=1; else clone=; here="$PWD"; fi
venv="${1:-${VENV:-$here/.venv}}"
default_spec="torch==2.13.0"
spec="${TORCH_SPEC:-$default_spec}"
py="${PYTHON:-python3}"
stamp="$venv/.fsdpc-stamp"
if [ -n "$clone" ]; then
  want="$spec|$(sha256sum "$here/pyproject.toml" | cut -c1-16)"
else
  want="$spec|$(find "$pkg" -name '*.py' -printf '%P %s\n' | sort | sha256sum | cut -c1-16)"
fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi
cpu_index="https://download.pytorch.org/whl/cpu"
has_gpu() {
  case "${FSDPC_ASSUME_GPU:-}" in 1) return 0 ;; 0) return 1 ;; esac
  { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; } || [ -e /dev/nvidia0 ]
}
pip_configured() {
  [ -n "${PIP_INDEX_URL:-}${PIP_EXTRA_INDEX_URL:-}${PIP_FIND_LINKS:-}" ] && return 0
  "$py" -m pip config list 2>/dev/null | grep -Eq '(index-url|find-links)='
}
choice="${TORCH_INDEX:-auto}"
if [ "$choice" = auto ]; then
  if [ "$(uname -s)/$(uname -m)" != Linux/x86_64 ]; then
    choice=default; why="not Linux x86_64: the default index's wheel has no CUDA build to avoid"
  elif has_gpu; then
    choice=default; why="a GPU is present"
  elif pip_configured; then
    choice=default; why="pip has an index or find-links configured: it decides"
  else
    choice=cpu; why="no GPU and no pip index configured: the default index would give the multi-GB CUDA build"
  fi
else
  why="TORCH_INDEX=$choice"
fi
case "$choice" in
  default) where="pip's configured/default index" ; torch_args=() ;;
  cpu) where="the PyTorch CPU index ($cpu_index)" ; torch_args=(--index-url "$cpu_index") ;;
  *) where="$choice" ; torch_args=(--index-url "$choice") ;;
esac
echo "setup-env: $spec from $where ($why; TORCH_INDEX=cpu|default|URL to choose)" >&2
if [ -n "${SETUP_ENV_DRY_RUN:-}" ]; then
  exit 0
fi
echo "setup-env: building $venv with $spec" >&2
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
if ! "${pip[@]}" "${torch_args[@]}" "$spec"; then
  [ "${#torch_args[@]}" -gt 0 ] || exit 1
  echo "setup-env: $where failed; falling back to pip's default index for $spec" >&2
  "${pip[@]}" "$spec"
fi
"${pip[@]}" numpy
if [ -z "$clone" ]; then
  # an installed package: its dependencies, then its own files copied in (rules above)
  "${pip[@]}" "rich>=13" "matplotlib>=3.5" "pytest>=7" "pytest-xdist>=3" parameterized \
    "hypothesis>=6"
  rm -rf "$venv/fsdpc-package"
  mkdir -p "$venv/fsdpc-package"
  cp -r "$pkg" "$venv/fsdpc-package/"
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$venv/fsdpc-package" > "$site/fsdpc-package.pth"
fi
[ -z "$clone" ] || "${pip[@]}" -e "$here[test,plots]"
# The trainers the examples run, with the installed torch pinned (rules above); the check
# below still fails the set-up if torch was replaced.
have_torch="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
constraint="$(mktemp)"
echo "torch==$have_torch" > "$constraint"
if [ -z "$clone" ]; then
  :  # the examples that need the trainers live in a clone only
elif ! "${pip[@]}" -c "$constraint" -e "$here[trainers]"; then
  if [ "$spec" = "$default_spec" ]; then
    rm -f "$constraint"
    echo "setup-env: the trainers extra cannot be installed next to torch $have_torch" >&2
    exit 1
  fi
  echo "setup-env: the trainers extra needs another torch than $have_torch: not installed" \
       "(the examples under examples/ need it; the conformance run does not)" >&2
fi
rm -f "$constraint"
"$venv/bin/python" - "$spec" <<'PY'
import sys, torch
spec = sys.argv[1]
want = spec.split("==", 1)[1] if "==" in spec else None
have = torch.__version__.split("+")[0]
if want and have != want:
    sys.exit(f"setup-env: asked for {spec} but torch {torch.__version__} is installed")
print(f"setup-env: torch {torch.__version__} ready", file=sys.stderr)
PY
echo "$want" > "$stamp"
