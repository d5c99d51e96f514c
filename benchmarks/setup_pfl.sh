#!/bin/sh
# Install pfl-research 0.6.0 (the optional W1 contender) into its own venv that reuses the main
# venv's packages (torch stays fairclip's torch 2.13.0; pip never replaces it here).
# Usage: sh benchmarks/setup_pfl.sh [VENV=/tmp/pflvenv] [MAIN_VENV=.venv]
# Then: FAIRCLIP_PFL_PYTHON=/tmp/pflvenv/bin/python fairclip bench w1   (/tmp/pflvenv is found anyway)
set -eu
VENV=${1:-/tmp/pflvenv}
MAIN=$(cd "${2:-.venv}" && pwd)
"$MAIN/bin/python" -m venv "$VENV"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
MAIN_SITE=$("$MAIN/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# pfl's own pins first; the main venv's packages (torch, numpy, scipy, fairclip) after them.
"$VENV/bin/pip" install --no-deps pfl==0.6.0 multiprocess dill prv-accountant absl-py dm-tree \
    'dp-accounting>=0.4,<0.6' 'wheel>=0.41.2,<0.46' 'packaging>=24,<26'
echo "$MAIN_SITE" > "$SITE/zz_fairclip_main_venv.pth"
"$VENV/bin/python" -c 'import pfl, pfl.model.pytorch, torch; print("pfl", pfl.__version__, "torch", torch.__version__)'
