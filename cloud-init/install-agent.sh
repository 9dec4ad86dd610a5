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
# Looked for, not imported: importing requests costs python a third of a second more
if ! python3 -c 'import importlib.util as u, sys; sys.exit(u.find_spec("requests") is None)'; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3 python3-requests
fi
install -D -m 0644 "$here/sp00ky-agent.service" "$root/etc/systemd/system/sp00ky-agent.service"
# Started first, enabled (for a reboot) after: the agent joins while the links are made.
# systemd loads a unit it has not seen yet when it starts it; a reload and a second start only
# if that start failed. Links only: a daemon-reload, or enabling a Docker that is enabled
# already (through its SysV script), costs a second each.
systemctl start docker.service sp00ky-agent.service || {
  systemctl daemon-reload && systemctl start docker.service sp00ky-agent.service
}
systemctl is-enabled --quiet docker.service || systemctl enable --no-reload docker.service
systemctl enable --no-reload sp00ky-agent.service
