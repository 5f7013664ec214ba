#!/usr/bin/env bash
# A one-node Slurm with accounting (munge, MariaDB, slurmdbd, slurmctld, slurmd), a
# PostgreSQL and an `mlflow server` on it, all on 127.0.0.1 and ports of their own, for
# tests/cluster. No systemd: every daemon is started directly and its PID written to
# $STATE/pids; `daemons.sh stop STATE` stops exactly those PIDs. cgroup-free settings
# (proctrack/linuxproc, task/none, jobacct_gather/linux): containers rarely let slurmd
# write cgroups. The node is a small GPU node as a lab's cluster has them: two GPUs
# declared as generic resources whose device files are /dev/null and /dev/zero (no GPU is
# needed: Slurm allocates them by index and sets CUDA_VISIBLE_DEVICES; with task/none it
# touches no device), four CPUs (more than this
# machine may have: config_overrides), the node feature `darel` for the timed jobs'
# constraint, and a requeued job back in the queue after 11 s instead of 121 s
# (cred_expire), started within 5 s of that (bf_interval).
#   daemons.sh start STATE PYTHON   (prints DAREL_PG_URI= and DAREL_MLFLOW_URI= lines)
#   daemons.sh stop STATE
set -Eeuo pipefail  # -E: the ERR trap below sees failures inside functions

STATE=${2:?state folder}
CTLD_PORT=${DAREL_SLURMCTLD_PORT:-16817}
SLURMD_PORT=${DAREL_SLURMD_PORT:-16818}
DBD_PORT=${DAREL_SLURMDBD_PORT:-16819}
PG_PORT=${DAREL_PG_PORT:-15432}
MLFLOW_PORT=${DAREL_MLFLOW_PORT:-15000}
HOST=$(hostname -s)
CONF_DIR=/etc/slurm
MARK="# written by darel tests/cluster/daemons.sh (removed by its stop)"

say() { echo "daemons: $*" >&2; }

record() { echo "$1 $2" >> "$STATE/pids"; }  # name pid

wait_for() {  # seconds, description, command...
  local secs=$1 what=$2; shift 2
  for _ in $(seq 1 $((secs * 2))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  say "$what did not come up within ${secs}s"; return 1
}

pid_of_file() { for _ in $(seq 1 40); do [ -s "$1" ] && { head -1 "$1"; return 0; }; sleep 0.25; done; return 1; }

start() {
  local PY=${3:?python of the virtual environment}
  mkdir -p "$STATE"/{slurm,spool,ctld,log,munge,mysql,pg,artifacts}
  chmod 755 "$STATE"  # PostgreSQL runs as its own user and must reach its folder (mktemp makes 700)
  : > "$STATE/pids"

  # munge: a key of this test only, on munge's standard socket (Slurm's clients look there).
  mkdir -p /run/munge
  [ -s "$STATE/munge/munge.key" ] || dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
  chmod 700 "$STATE/munge"; chmod 400 "$STATE/munge/munge.key"
  /usr/sbin/munged --force --key-file="$STATE/munge/munge.key" --socket=/run/munge/munge.socket.2 \
    --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/log/munged.log" --seed-file="$STATE/munge/seed"
  record munged "$(pid_of_file "$STATE/munge/munged.pid")"

  # MariaDB for slurmdbd: its own data folder, socket only.
  mariadb-install-db --user=root --datadir="$STATE/mysql/data" --auth-root-authentication-method=normal \
    --skip-test-db >"$STATE/log/mysql-install.log" 2>&1
  /usr/sbin/mariadbd --user=root --datadir="$STATE/mysql/data" --socket="$STATE/mysql/mysql.sock" \
    --skip-networking --pid-file="$STATE/mysql/mysqld.pid" --log-error="$STATE/log/mysqld.log" \
    --innodb-buffer-pool-size=64M >/dev/null 2>&1 &
  record mariadbd $!
  wait_for 60 MariaDB mariadb --socket="$STATE/mysql/mysql.sock" -uroot -e "select 1"
  mariadb --socket="$STATE/mysql/mysql.sock" -uroot -e \
    "create database if not exists slurm_acct_db; create user if not exists 'slurm'@'localhost' identified by 'slurmpw'; grant all on slurm_acct_db.* to 'slurm'@'localhost'; flush privileges;"

  # Slurm's standard place: the plugin's job step drops SLURM_* variables (SLURM_CONF too)
  # before its srun, so the configuration must be where every Slurm client looks. A file
  # that was there is kept aside and put back by `stop`.
  mkdir -p "$CONF_DIR"
  for f in slurm.conf slurmdbd.conf gres.conf; do
    if [ -e "$CONF_DIR/$f" ] && ! grep -q "^$MARK" "$CONF_DIR/$f"; then mv "$CONF_DIR/$f" "$CONF_DIR/$f.darel-saved"; fi
  done
  cat > "$CONF_DIR/slurm.conf" <<CONF
$MARK
ClusterName=darel
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStorageEnforce=associations
AccountingStorageTRES=gres/gpu
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
JobRequeue=1
MpiDefault=none
GresTypes=gpu
SlurmdParameters=config_overrides
NodeName=$HOST CPUs=4 RealMemory=$(( $(free -m | awk '/^Mem:/{print $2}') * 3 / 4 )) Gres=gpu:2 Features=darel State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  cat > "$CONF_DIR/slurmdbd.conf" <<CONF
$MARK
AuthType=auth/munge
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$STATE/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StoragePort=0
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=slurmpw
CONF
  cat > "$CONF_DIR/gres.conf" <<CONF
$MARK
AutoDetect=off
NodeName=$HOST Name=gpu File=/dev/null
NodeName=$HOST Name=gpu File=/dev/zero
CONF
  # MariaDB on a socket: the client library reads it from the environment.
  chmod 600 "$CONF_DIR/slurmdbd.conf"
  export MYSQL_UNIX_PORT="$STATE/mysql/mysql.sock"

  /usr/sbin/slurmdbd
  record slurmdbd "$(pid_of_file "$STATE/slurmdbd.pid")"
  wait_for 60 slurmdbd sacctmgr -n list cluster
  sacctmgr -i add cluster darel >/dev/null 2>&1 || true
  sacctmgr -i add account darel cluster=darel >/dev/null 2>&1 || true
  sacctmgr -i add user root account=darel cluster=darel >/dev/null 2>&1 || true
  /usr/sbin/slurmctld
  record slurmctld "$(pid_of_file "$STATE/slurmctld.pid")"
  /usr/sbin/slurmd
  record slurmd "$(pid_of_file "$STATE/slurmd.pid")"
  wait_for 60 "the node" bash -c "sinfo -h -o %T | grep -qE '^(idle|mixed|allocated)'"

  # PostgreSQL (the MLflow server's store), trust on 127.0.0.1 only.
  chown postgres "$STATE/pg"; chmod 700 "$STATE/pg"
  local PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  runuser -u postgres -- "$PGBIN/initdb" -D "$STATE/pg/data" --auth=trust -U postgres >"$STATE/pg/initdb.log" 2>&1
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$STATE/pg/data" -l "$STATE/pg/postgres.log" \
    -o "-p $PG_PORT -k $STATE/pg -c listen_addresses=127.0.0.1" start >/dev/null
  record postgres "$(pid_of_file "$STATE/pg/data/postmaster.pid")"
  wait_for 60 PostgreSQL "$PGBIN/pg_isready" -h 127.0.0.1 -p "$PG_PORT"
  "$PGBIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -qc "create user mlflow" -c "create database mlflow owner mlflow" >/dev/null

  local PG_URI="postgresql://mlflow@127.0.0.1:$PG_PORT/mlflow"
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false MLFLOW_DISABLE_TELEMETRY=true \
    "$(dirname "$PY")/mlflow" server --backend-store-uri "$PG_URI" --artifacts-destination "$STATE/artifacts" \
    --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 1 --allowed-hosts "127.0.0.1:$MLFLOW_PORT,localhost:$MLFLOW_PORT" \
    >"$STATE/log/mlflow.log" 2>&1 &
  record mlflow $!
  wait_for 120 "mlflow server" "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$MLFLOW_PORT/health')"

  echo "DAREL_PG_URI=$PG_URI"
  echo "DAREL_MLFLOW_URI=http://127.0.0.1:$MLFLOW_PORT"
}

stop() {
  [ -f "$STATE/pids" ] || return 0
  # Reverse order: the server before its database, slurmd before slurmctld, ...
  tac "$STATE/pids" | while read -r name pid; do
    [ -n "$pid" ] || continue
    if [ "$name" = mlflow ]; then pkill -TERM -P "$pid" 2>/dev/null || true; fi  # its gunicorn/uvicorn workers (children of this PID only)
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    if kill -0 "$pid" 2>/dev/null; then say "$name ($pid) ignored SIGTERM: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
  done
  : > "$STATE/pids"
  for f in slurm.conf slurmdbd.conf gres.conf; do
    if [ -e "$CONF_DIR/$f" ] && grep -q "^$MARK" "$CONF_DIR/$f"; then rm -f "$CONF_DIR/$f"; fi
    if [ -e "$CONF_DIR/$f.darel-saved" ]; then mv "$CONF_DIR/$f.darel-saved" "$CONF_DIR/$f"; fi
  done
}

case "${1:-}" in
  start) trap 'say "start failed (line $LINENO): stopping what was started"; stop' ERR; start "$@" ;;
  stop) stop ;;
  *) echo "usage: daemons.sh start STATE PYTHON | stop STATE" >&2; exit 2 ;;
esac
