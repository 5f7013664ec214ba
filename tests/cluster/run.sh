#!/usr/bin/env bash
# `make test-cluster`: the README's "Many machines" on this machine. Installs what it needs
# (Debian: slurm-wlm slurmdbd munge mariadb-server postgresql; pip: requirements-cluster.lock),
# starts a one-node Slurm with accounting, PostgreSQL and `mlflow server` (tests/cluster/
# daemons.sh, every daemon on 127.0.0.1 and ports of its own), runs tests/cluster, and stops
# every daemon it started by its PID, whatever the outcome.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python

if [ "$(id -u)" != 0 ]; then
  echo "make test-cluster: needs root (it installs Debian packages and starts munge, MariaDB, slurmdbd, slurmctld, slurmd and PostgreSQL); run it as root, as CI does" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "make test-cluster: needs apt-get (Debian packages slurm-wlm slurmdbd munge mariadb-server postgresql)" >&2
  exit 1
fi

PACKAGES="slurm-wlm slurmdbd munge mariadb-server postgresql"
missing=$(for p in $PACKAGES; do dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"; done)
if [ -n "$missing" ]; then
  echo "test-cluster: installing $(echo $missing)" >&2
  # No daemon may start on its own (there is no systemd; the tests start their own).
  policy_made=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; policy_made=1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/tmp/darel-test-cluster-apt.log 2>&1 \
    || { tail -20 /tmp/darel-test-cluster-apt.log; exit 1; }
  [ "$policy_made" = 1 ] && rm -f /usr/sbin/policy-rc.d
fi
if ! $PY -c "import snakemake_executor_plugin_slurm, psycopg2, moto, dvc_s3" 2>/dev/null; then
  echo "test-cluster: installing requirements-cluster.lock" >&2
  $PY -m pip install -q -r requirements-cluster.lock -c requirements.lock
fi

STATE=$(mktemp -d /tmp/darel-cluster.XXXXXX)
trap 'bash tests/cluster/daemons.sh stop "$STATE"' EXIT
start=$(date +%s)
bash tests/cluster/daemons.sh start "$STATE" "$PY" > "$STATE/env"
while IFS= read -r line; do export "$line"; done < "$STATE/env"
echo "test-cluster: daemons up in $(( $(date +%s) - start )) s ($DAREL_MLFLOW_URI on $DAREL_PG_URI)" >&2
export DAREL_CLUSTER_STATE="$STATE" MLFLOW_DISABLE_TELEMETRY=true
# tests/test_slurm.py again: make test skips its tests that need the Slurm executor plugin, installed above.
$PY -m pytest -q -p no:cacheprovider -o addopts= -ra --durations=10 tests/cluster tests/test_slurm.py
