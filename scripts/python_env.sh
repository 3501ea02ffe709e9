#!/usr/bin/env bash
# Makes the Python environment of the client tests: .venv at the repo root with
# tests/python/requirements.txt installed. Reinstalls only when the requirements change
# (their hash is kept in .venv), so a run when up to date takes a fraction of a second.
set -euo pipefail
cd "$(dirname "$0")/.."

req=tests/python/requirements.txt
stamp=.venv/.requirements.sha256
want=$(sha256sum "$req" | cut -d' ' -f1)

# A venv whose interpreter is gone (python upgraded or removed) is made anew.
if [ -d .venv ] && ! .venv/bin/python -c '' >/dev/null 2>&1; then
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv || {
    rm -rf .venv
    echo "python_env.sh: cannot make a venv; on Debian/Ubuntu: apt-get install python3-venv" >&2
    exit 1
  }
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "$req"
  echo "$want" >"$stamp"
fi
