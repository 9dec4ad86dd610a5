#!/bin/sh
# Installs the sp00ky agent on a pool machine. It ships in the agent archive, beside the agent
# and its unit; the bootstrap (agent/bootstrap.py) runs it once it has checked the archive's
# sha256 against the user-data's and unpacked it. ROOT (default /): the filesystem to install
# into. Installs Docker and python3-requests where missing.
set -eu
root="${1:-/}"
here=$(dirname "$0")
if ! command -v docker >/dev/null 2>&1; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io
fi
if ! python3 -c 'import requests' >/dev/null 2>&1; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3 python3-requests
fi
install -D -m 0644 "$here/sp00ky-agent.service" "$root/etc/systemd/system/sp00ky-agent.service"
systemctl daemon-reload
systemctl enable --now docker.service sp00ky-agent.service
