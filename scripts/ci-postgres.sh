#!/usr/bin/env bash
# A private PostgreSQL for lockd-check's fenced store: installs Debian's postgresql if missing,
# starts one cluster on loopback (idempotent: a running cluster is reused), and prints its
# connection string as the only line on stdout:
#
#   export LOCKD_CHECK_PG="$(scripts/ci-postgres.sh)"     # start (or reuse)
#   scripts/ci-postgres.sh stop                            # stop it (by the postmaster's pid)
#
# Settings: LOCKD_PG_DIR (default /tmp/lockd-check-pg), LOCKD_PG_PORT (default 54329).
# PostgreSQL refuses to run as root, so when run as root the cluster belongs to the `postgres` OS
# user (created by the Debian package). Durability is off (fsync=off): this is a test fixture.
set -euo pipefail

dir="${LOCKD_PG_DIR:-/tmp/lockd-check-pg}"
port="${LOCKD_PG_PORT:-54329}"
data="$dir/data"
conn="host=127.0.0.1 port=$port user=postgres dbname=postgres"

log() { echo "ci-postgres: $*" >&2; }

bindir() {
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
  [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}

as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

postmaster_pid() {
  [ -f "$data/postmaster.pid" ] || return 1
  local pid
  pid="$(head -n 1 "$data/postmaster.pid")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

if [ "${1:-start}" = stop ]; then
  if pid="$(postmaster_pid)"; then
    log "stopping postmaster pid $pid"
    kill -TERM "$pid"
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || { log "stopped"; exit 0; }
      sleep 0.1
    done
    log "pid $pid still running after 10 s; sending SIGQUIT"
    kill -QUIT "$pid" 2>/dev/null || true
  else
    log "not running"
  fi
  exit 0
fi

bin="$(bindir || true)"
if [ -z "$bin" ]; then
  log "installing postgresql (Debian)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
  bin="$(bindir)"
fi

if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --home-dir "$dir" --shell /usr/sbin/nologin postgres
fi

if pid="$(postmaster_pid)"; then
  log "already running (pid $pid)"
else
  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
  if [ ! -f "$data/PG_VERSION" ]; then
    log "initdb $data"
    as_owner "$bin/initdb" -D "$data" -U postgres --auth=trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; exit 1; }
  fi
  mkdir -p "$dir/sock"
  if [ "$(id -u)" = 0 ]; then chown postgres: "$dir/sock"; fi
  log "starting on 127.0.0.1:$port"
  as_owner "$bin/pg_ctl" -D "$data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir/sock -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
    start >&2 || { tail -n 30 "$dir/server.log" >&2; exit 1; }
  log "running (pid $(postmaster_pid))"
fi

# Wait (bounded) until it answers on TCP.
for _ in $(seq 1 50); do
  if "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"; then
    echo "$conn"
    exit 0
  fi
  sleep 0.2
done
log "not answering on 127.0.0.1:$port"; tail -n 30 "$dir/server.log" >&2
exit 1
