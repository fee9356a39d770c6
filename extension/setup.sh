#!/bin/sh
# Install the Pathways sidebar into a virtual environment: `sh extension/setup.sh .venv`.
#
# The built extension (pwkernel/labextension/) is committed, so a machine without Node still
# gets it. Where npm is available the dependencies are installed (pinned by package-lock.json;
# the TypeScript tests need them) and the extension is rebuilt from src/ unless the committed
# build was made from these very sources (its sources.json holds their fingerprint): a
# rebuild's bundle names differ from machine to machine, and would dirty a fresh checkout.
# PWKERNEL_REBUILD_EXTENSION=1 rebuilds anyway. If the build fails (offline, say) the
# committed build is used and we say so. The build is then linked where JupyterLab looks for
# prebuilt extensions in the environment.
set -eu
VENV=$(cd "${1:-.venv}" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILT="$ROOT/pwkernel/labextension"

current() {  # the committed build's fingerprint is the sources' own
	[ "${PWKERNEL_REBUILD_EXTENSION:-0}" != 1 ] && [ -f "$BUILT/sources.json" ] || return 1
	now=$(mktemp)
	(cd "$ROOT/extension" && node hash-sources.mjs "$now" >/dev/null) &&
		cmp -s "$now" "$BUILT/sources.json"
	same=$?
	rm -f "$now"
	return $same
}

if command -v npm >/dev/null 2>&1; then
	if ! (cd "$ROOT/extension" && npm ci --no-audit --no-fund --loglevel=error); then
		echo "pwkernel: WARNING: could not install extension/'s dependencies (see above);" \
			"using the committed build in pwkernel/labextension" >&2
	elif current; then
		echo "pwkernel: the committed JupyterLab extension is built from extension/src as it is"
	elif (cd "$ROOT/extension" && PATH="$VENV/bin:$PATH" npm run --silent build); then
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
