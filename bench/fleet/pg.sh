#!/usr/bin/env bash
# Starts a PostgreSQL of its own for idemfleet (bench/cmd/idemfleet), with
# pg_stat_statements loaded, and prints the environment idemfleet reads:
#
#   eval "$(bash bench/fleet/pg.sh)"      # start (idempotent), then export
#   go run ./bench/cmd/idemfleet
#   bash bench/fleet/pg.sh stop           # stop it, keep its data
#   bash bench/fleet/pg.sh clean          # stop it and delete its data
#
# It is not the shared test server of .ci/services.sh: pg_stat_statements
# needs shared_preload_libraries, which only a restart sets, and restarting
# the shared server would break the tests other people run against it.
# Same binaries, its own port (IDEMFLEET_PG_PORT, default 5511) and data
# directory (IDEMFLEET_PG_DIR, default /var/tmp/idemfleet-pg), loopback only,
# trusted; the PostgreSQL defaults otherwise (synchronous_commit on, fsync on),
# so that every commit waits for the WAL on disk, as in production.
# Debian 12 as root, as .ci/services.sh.
set -euo pipefail

DIR=${IDEMFLEET_PG_DIR:-/var/tmp/idemfleet-pg}
PORT=${IDEMFLEET_PG_PORT:-5511}
DATA=$DIR/data
DB=idemfleet

log() { echo "fleet-pg: $*" >&2; }
die() { log "$*"; exit 1; }

bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bin" ] && [ -x "$bin/initdb" ] || die "PostgreSQL binaries not found under /usr/lib/postgresql (bash .ci/services.sh installs them)"
as_postgres() { runuser -u postgres -- "$@"; }

case "${1:-start}" in
stop)
  as_postgres "$bin/pg_ctl" -D "$DATA" stop -m fast >&2 || true
  exit 0 ;;
clean)
  as_postgres "$bin/pg_ctl" -D "$DATA" stop -m fast >&2 || true
  rm -rf "$DIR"
  exit 0 ;;
start) ;;
*) die "usage: $0 [start|stop|clean]" ;;
esac

mkdir -p "$DIR"
chown postgres:postgres "$DIR"
if [ ! -s "$DATA/PG_VERSION" ]; then
  log "initdb $DATA"
  as_postgres "$bin/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --no-sync >"$DIR/initdb.log" 2>&1 \
    || { cat "$DIR/initdb.log" >&2; die "initdb failed"; }
fi
if ! as_postgres "$bin/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  log "starting postgresql on 127.0.0.1:$PORT"
  as_postgres "$bin/pg_ctl" -D "$DATA" -l "$DIR/server.log" -w -t 60 \
    -o "-p $PORT -c listen_addresses=127.0.0.1 -k $DIR -c max_connections=400 \
        -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all \
        -c track_io_timing=on -c track_wal_io_timing=on" start >&2 \
    || { tail -n 20 "$DIR/server.log" >&2; die "postgresql did not start"; }
fi
for _ in $(seq 600); do "$bin/pg_isready" -q -h 127.0.0.1 -p "$PORT" && break; sleep 0.1; done
"$bin/pg_isready" -q -h 127.0.0.1 -p "$PORT" || die "postgresql not ready"
if ! "$bin/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1; then
  "$bin/createdb" -h 127.0.0.1 -p "$PORT" -U postgres "$DB"
fi
"$bin/psql" -q -h 127.0.0.1 -p "$PORT" -U postgres -d "$DB" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >&2
echo "export IDEMFLEET_PG_URL='postgres://postgres@127.0.0.1:$PORT/$DB?sslmode=disable'"
echo "export IDEMFLEET_PG_PID=$(head -n 1 "$DATA/postmaster.pid")"
