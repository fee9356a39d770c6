#!/bin/sh
# Install the Pathways sidebar into a virtual environment: `sh extension/setup.sh .venv`.
#
# The built extension (pwkernel/labextension/) is committed, so a machine without Node still
# gets it. Where npm is available the extension is rebuilt from src/ first (dependencies pinned
# by package-lock.json); if that fails (offline, say) the committed build is used and we say so.
# The build is then linked where JupyterLab looks for prebuilt extensions in the environment.
set -eu
VENV=$(cd "${1:-.venv}" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILT="$ROOT/pwkernel/labextension"

if command -v npm >/dev/null 2>&1; then
	if (cd "$ROOT/extension" && npm ci --no-audit --no-fund --loglevel=error &&
		PATH="$VENV/bin:$PATH" npm run --silent build); then
		echo "pwkernel: built the JupyterLab extension from extension/src"
	else
		echo "pwkernel: WARNING: could not build extension/ (see above); using the committed" \
			"build in pwkernel/labextension" >&2
	fi
fi
if [ ! -f "$BUILT/package.json" ]; then
	echo "pwkernel: no built extension in $BUILT and no npm to build it: install Node >= 20" \
		"and rerun make setup" >&2
	exit 1
fi
DEST="$VENV/share/jupyter/labextensions/pwkernel"
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST"
ln -s "$BUILT" "$DEST"
echo "pwkernel: JupyterLab extension linked at $DEST"
