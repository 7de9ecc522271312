#!/usr/bin/env bash
# Create .venv with torch 2.13.0 (the local CPU wheel) first, then trainfit and its extras.
# A bare `torch` requirement would pull a multi-GB CUDA build, so torch is pinned here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# The probe's torchtune stack runs in a venv of its own, .venv-torchtune: torchtune 0.6.1 imports
# torchao.dtypes.nf4tensor (gone from torchao 0.16), and peft 0.21 refuses to apply LoRA at all
# beside a torchao older than 0.16 (peft/import_utils.py:162 raises ImportError), so the two
# cannot share .venv. `make test` runs tests/probe/test_torchtune_stack.py with it (~50 s here).
# It is installed beside .venv, in the background (pip is mostly one core; CI's setup time).
setup_torchtune_venv() {
  if [ ! -x .venv-torchtune/bin/python ]; then
    "$PY" -m venv .venv-torchtune
  fi
  if ! .venv-torchtune/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
    .venv-torchtune/bin/python -m pip install -q torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
  fi
  # trainfit's own dependencies and the torchtune extra, read from pyproject.toml; the project
  # itself is not installed there (the tests import it from the tree), so this pip never builds
  # trainfit.egg-info beside the main install's.
  mapfile -t requirements < <("$PY" -c 'import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["torchtune"]))')
  .venv-torchtune/bin/python -m pip install -q "${requirements[@]}" "pytest>=8" 2>&1 | grep -v "^WARNING: Location" || true
  version=$(.venv-torchtune/bin/python -m pip show torch | awk '/^Version:/{print $2}')
  case "$version" in
    2.13.0*) ;;
    *) echo "setup: expected torch 2.13.0 in .venv-torchtune, found $version" >&2; exit 1 ;;
  esac
}

setup_torchtune_venv > .venv-torchtune.log 2>&1 &
torchtune_pid=$!

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  .venv/bin/python -m pip install -q torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
fi
# Not the `torchtitan` extra (tests/probe/test_torchtitan_stack.py skips without it): on this
# machine it took 2 min 20 s (1:49 torchtitan 0.3.0 + deps, 0:33 the 286 MB triton wheel it
# imports), above setup's budget, and its datasets<4.8 pin moves huggingface_hub 2.4 -> 1.33
# and fsspec back under transformers; torch stays 2.13.0. Install it into a venv of its own.
.venv/bin/python -m pip install -q -e ".[service,probe,dev,inputs]" 2>&1 | grep -v "^WARNING: Location" || true
version=$(.venv/bin/python -m pip show torch | awk '/^Version:/{print $2}')
case "$version" in
  2.13.0*) ;;
  *) echo "setup: expected torch 2.13.0, found $version" >&2; exit 1 ;;
esac

# TRL 1.8.0 (axolotl 067b021c's pin), whose DPOTrainer makes the full logits (`--objective dpo
# --loss full`), beside .venv's TRL 1.16: its files alone in .trl-1.8 (pure Python, its
# dependencies are .venv's), put first on PYTHONPATH by tests/probe/test_dpo_full_logits.py.
if [ ! -f .trl-1.8/trl/__init__.py ]; then
  .venv/bin/python -m pip install -q --no-deps --target .trl-1.8 trl==1.8.0 2>&1 | grep -v "^WARNING: Location" || true
fi

if ! wait "$torchtune_pid"; then
  cat .venv-torchtune.log >&2
  exit 1
fi
grep -v "^$" .venv-torchtune.log || true
