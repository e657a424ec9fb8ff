#!/usr/bin/env bash
# Install Azurite, Microsoft's Azure Blob Storage emulator (npm, MIT), for the az:// tests
# (tests/conftest.py `azurite_server` starts it on loopback). Needs node and npm; installs into
# $PACKTOOL_AZURITE_HOME (default ~/.cache/packtool-azurite), once.
set -euo pipefail
VERSION=3.37.0
HOME_DIR="${PACKTOOL_AZURITE_HOME:-$HOME/.cache/packtool-azurite}"
if [ -x "$HOME_DIR/node_modules/.bin/azurite-blob" ]; then
  echo "Azurite already in $HOME_DIR"
  exit 0
fi
command -v npm >/dev/null || { echo "npm not found: install node and npm to run the az:// tests" >&2; exit 1; }
mkdir -p "$HOME_DIR"
npm install --prefix "$HOME_DIR" --no-audit --no-fund --loglevel=error "azurite@$VERSION"
echo "Azurite $VERSION in $HOME_DIR"
