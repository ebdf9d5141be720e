#!/usr/bin/env bash
# Starts the PostgreSQL and Redis servers that the contrib/postgres and
# contrib/redis tests run against, on loopback only, and prints the
# environment the tests read:
#
#   eval "$(bash .ci/services.sh)"          # start (idempotent), then export
#   go test -race ./contrib/...
#   bash .ci/services.sh stop               # stop both servers, keep their data
#   bash .ci/services.sh clean              # stop both and delete their data
#
# The export lines go to stdout and to $STATE/env (source it instead of
# eval if you prefer); progress goes to stderr. Debian 12 as root: missing
# packages are installed with apt-get.
#
# The servers are private to this script, on their own ports and data
# directory, so that they never collide with a PostgreSQL or Redis the
# machine already runs (Debian's postgresql package starts a cluster on
# 5432 on machines with systemd). PostgreSQL trusts loopback connections:
# it listens on 127.0.0.1 and a socket in $STATE only, and holds test data.
#
# Settings (environment): IDEMHTTP_SERVICES_DIR (state, default
# /var/tmp/idemhttp-services), IDEMHTTP_PG_PORT (default 5433),
# IDEMHTTP_REDIS_PORT (default 6380).
set -euo pipefail

STATE=${IDEMHTTP_SERVICES_DIR:-/var/tmp/idemhttp-services}
PG_PORT=${IDEMHTTP_PG_PORT:-5433}
REDIS_PORT=${IDEMHTTP_REDIS_PORT:-6380}
PG_DATA=$STATE/pg/data
PG_DB=idemtest
WAIT_SECONDS=60

log() { echo "services: $*" >&2; }
die() { log "$*"; exit 1; }

pg_bin() {
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$bin" ] && [ -x "$bin/initdb" ] || return 1
  echo "$bin"
}

install_packages() {
  if pg_bin >/dev/null && command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
    return
  fi
  log "installing postgresql and redis-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends postgresql redis-server >&2
}

as_postgres() { runuser -u postgres -- "$@"; }

start_postgres() {
  local bin
  bin=$(pg_bin) || die "PostgreSQL binaries not found under /usr/lib/postgresql"
  mkdir -p "$STATE/pg"
  chown postgres:postgres "$STATE/pg"
  if [ ! -s "$PG_DATA/PG_VERSION" ]; then
    log "initdb $PG_DATA"
    # --no-sync: a crash during setup costs a rerun, not data anyone needs.
    as_postgres "$bin/initdb" -D "$PG_DATA" -U postgres -A trust -E UTF8 --no-sync >"$STATE/pg/initdb.log" 2>&1 \
      || { cat "$STATE/pg/initdb.log" >&2; die "initdb failed"; }
  fi
  if as_postgres "$bin/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; then
    log "postgresql already running on 127.0.0.1:$PG_PORT"
  else
    log "starting postgresql on 127.0.0.1:$PG_PORT"
    as_postgres "$bin/pg_ctl" -D "$PG_DATA" -l "$STATE/pg/server.log" -w -t "$WAIT_SECONDS" \
      -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -k $STATE/pg -c max_connections=300" start >&2 \
      || { tail -n 20 "$STATE/pg/server.log" >&2; die "postgresql did not start"; }
  fi
  local i
  for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
    "$bin/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" && break
    sleep 0.1
  done
  "$bin/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" || die "postgresql not ready after ${WAIT_SECONDS}s"
  if ! "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" | grep -q 1; then
    log "creating database $PG_DB"
    "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres "$PG_DB"
  fi
}

redis_up() { [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]; }

start_redis() {
  mkdir -p "$STATE/redis"
  if redis_up; then
    log "redis already running on 127.0.0.1:$REDIS_PORT"
  else
    log "starting redis on 127.0.0.1:$REDIS_PORT"
    # No persistence: the tests create their own keys, and the restart
    # test runs a private server of its own.
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
      --daemonize yes --dir "$STATE/redis" --pidfile "$STATE/redis/redis.pid" \
      --logfile "$STATE/redis/server.log" >&2
  fi
  local i
  for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
    redis_up && return
    sleep 0.1
  done
  tail -n 20 "$STATE/redis/server.log" >&2 || true
  die "redis not answering after ${WAIT_SECONDS}s"
}

start() {
  [ "$(id -u)" = 0 ] || die "run as root (it installs packages and runs the servers as their users)"
  install_packages
  mkdir -p "$STATE"
  chmod 755 "$STATE"
  start_postgres
  start_redis
  cat >"$STATE/env" <<EOF
export IDEMHTTP_POSTGRES_URL='postgres://postgres@127.0.0.1:$PG_PORT/$PG_DB?sslmode=disable'
export IDEMHTTP_REDIS_ADDR='127.0.0.1:$REDIS_PORT'
EOF
  cat "$STATE/env"
}

stop() {
  local bin
  if [ -s "$STATE/redis/redis.pid" ] && redis_up; then
    log "stopping redis on 127.0.0.1:$REDIS_PORT"
    redis-cli -h 127.0.0.1 -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    local i
    for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
      redis_up || break
      sleep 0.1
    done
  fi
  rm -f "$STATE/redis/redis.pid"
  if bin=$(pg_bin) && [ -s "$PG_DATA/PG_VERSION" ] &&
      as_postgres "$bin/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; then
    log "stopping postgresql on 127.0.0.1:$PG_PORT"
    as_postgres "$bin/pg_ctl" -D "$PG_DATA" -m fast -w -t "$WAIT_SECONDS" stop >&2
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  clean) stop; rm -rf "$STATE" ;;
  *) die "usage: $0 [start|stop|clean]" ;;
esac
