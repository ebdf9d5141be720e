#!/usr/bin/env bash
# Starts the PostgreSQL, Redis, RabbitMQ and NATS (JetStream) servers that
# the contrib/ tests run against, on loopback only, and prints the
# environment the tests read:
#
#   eval "$(bash .ci/services.sh)"          # start (idempotent), then export
#   go test -race ./contrib/...
#   bash .ci/services.sh stop               # stop the servers, keep their data
#   bash .ci/services.sh clean              # stop them and delete their data
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
# RabbitMQ runs as its own node (idemhttp@localhost) with its own Erlang
# port mapper, distribution port, cookie, data and logs under $STATE, all on
# loopback, and no plugins (the management plugin doubles the start time).
# It is the slowest to start (about 10 s on a busy 2-core machine for a
# first boot), so it starts in the background while PostgreSQL starts.
#
# Settings (environment): IDEMHTTP_SERVICES_DIR (state, default
# /var/tmp/idemhttp-services), IDEMHTTP_PG_PORT (default 5433),
# IDEMHTTP_REDIS_PORT (default 6380), IDEMHTTP_AMQP_PORT (default 5673;
# the Erlang distribution port is this + 20000), IDEMHTTP_EPMD_PORT
# (default 4370), IDEMHTTP_NATS_PORT (default 4223).
set -euo pipefail

STATE=${IDEMHTTP_SERVICES_DIR:-/var/tmp/idemhttp-services}
PG_PORT=${IDEMHTTP_PG_PORT:-5433}
REDIS_PORT=${IDEMHTTP_REDIS_PORT:-6380}
AMQP_PORT=${IDEMHTTP_AMQP_PORT:-5673}
EPMD_PORT=${IDEMHTTP_EPMD_PORT:-4370}
NATS_PORT=${IDEMHTTP_NATS_PORT:-4223}
RMQ_NODE=idemhttp@localhost
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
  if pg_bin >/dev/null && command -v redis-server >/dev/null && command -v redis-cli >/dev/null &&
      [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] && command -v nats-server >/dev/null; then
    return
  fi
  log "installing postgresql, redis-server, rabbitmq-server and nats-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends postgresql redis-server rabbitmq-server nats-server >&2
}

# port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

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

RMQ_DIR=$STATE/rabbitmq

# rmq_env prints the environment that places the RabbitMQ node, its CLI
# tools and its port mapper on this script's private ports and files. The
# Debian package's own node (rabbit@host, 5672, /var/lib/rabbitmq) is never
# touched.
rmq_env() {
  cat <<EOF
HOME=$RMQ_DIR
RABBITMQ_NODENAME=$RMQ_NODE
RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
RABBITMQ_NODE_PORT=$AMQP_PORT
RABBITMQ_DIST_PORT=$((AMQP_PORT + 20000))
ERL_EPMD_PORT=$EPMD_PORT
ERL_EPMD_ADDRESS=127.0.0.1
RABBITMQ_MNESIA_BASE=$RMQ_DIR/mnesia
RABBITMQ_LOG_BASE=$RMQ_DIR/log
RABBITMQ_CONFIG_FILE=$RMQ_DIR/rabbitmq.conf
RABBITMQ_ENABLED_PLUGINS_FILE=$RMQ_DIR/enabled_plugins
RABBITMQ_CONF_ENV_FILE=$RMQ_DIR/rabbitmq-env.conf
RABBITMQ_PID_FILE=$RMQ_DIR/rabbitmq.pid
EOF
}

as_rabbitmq() {
  local -a envs
  mapfile -t envs < <(rmq_env)
  # The distribution listener binds to loopback too (the default is every
  # interface); the value has spaces, so it is passed apart from the rest.
  runuser -u rabbitmq -- env "${envs[@]}" \
    "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}" "$@"
}

# start_rabbitmq launches the node in the background and returns at once;
# wait_rabbitmq waits for its AMQP listener (RabbitMQ opens it last, once
# the broker has booted).
start_rabbitmq() {
  if port_open "$AMQP_PORT"; then
    log "rabbitmq already running on 127.0.0.1:$AMQP_PORT"
    return
  fi
  mkdir -p "$RMQ_DIR/log"
  if [ ! -s "$RMQ_DIR/.erlang.cookie" ]; then
    head -c 32 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$RMQ_DIR/.erlang.cookie"
  fi
  chmod 400 "$RMQ_DIR/.erlang.cookie"
  cat >"$RMQ_DIR/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$AMQP_PORT
# A shared test machine may have little free disk; the default limit
# (50 MB) would block publishers with no message saying why.
disk_free_limit.absolute = 10MB
EOF
  echo '[].' >"$RMQ_DIR/enabled_plugins"
  : >"$RMQ_DIR/rabbitmq-env.conf"
  chown -R rabbitmq:rabbitmq "$RMQ_DIR"
  log "starting rabbitmq on 127.0.0.1:$AMQP_PORT (node $RMQ_NODE)"
  RMQ_STARTED=$(date +%s%N)
  as_rabbitmq setsid /usr/lib/rabbitmq/bin/rabbitmq-server \
    >"$RMQ_DIR/log/startup.log" 2>&1 </dev/null &
  disown || true
}

wait_rabbitmq() {
  local i
  for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
    if port_open "$AMQP_PORT"; then
      if [ -n "${RMQ_STARTED:-}" ]; then
        log "rabbitmq ready after $(( ($(date +%s%N) - RMQ_STARTED) / 1000000 )) ms"
      fi
      return
    fi
    sleep 0.1
  done
  tail -n 30 "$RMQ_DIR/log/startup.log" >&2 || true
  die "rabbitmq not listening after ${WAIT_SECONDS}s"
}

stop_rabbitmq() {
  if port_open "$AMQP_PORT" && [ -d "$RMQ_DIR" ]; then
    log "stopping rabbitmq on 127.0.0.1:$AMQP_PORT"
    # Given the pid file, rabbitmqctl waits for the node's process to exit.
    as_rabbitmq /usr/lib/rabbitmq/bin/rabbitmqctl -q -n "$RMQ_NODE" stop "$RMQ_DIR/rabbitmq.pid" >&2 || true
  fi
  # The node's private port mapper outlives it; it refuses to die while a
  # name is registered, so ask once the node (and rabbitmqctl's own
  # node) are gone.
  local i
  for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
    ERL_EPMD_PORT=$EPMD_PORT epmd -kill >/dev/null 2>&1 || true
    port_open "$EPMD_PORT" || break
    sleep 0.1
  done
}

NATS_DIR=$STATE/nats

start_nats() {
  mkdir -p "$NATS_DIR"
  chown nats:nats "$NATS_DIR"
  if port_open "$NATS_PORT"; then
    log "nats already running on 127.0.0.1:$NATS_PORT"
  else
    log "starting nats-server (JetStream) on 127.0.0.1:$NATS_PORT"
    runuser -u nats -- setsid nats-server -js -a 127.0.0.1 -p "$NATS_PORT" -sd "$NATS_DIR/jetstream" \
      -P "$NATS_DIR/nats.pid" -l "$NATS_DIR/server.log" </dev/null >/dev/null 2>&1 &
    disown || true
  fi
  local i
  for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
    port_open "$NATS_PORT" && return
    sleep 0.1
  done
  tail -n 20 "$NATS_DIR/server.log" >&2 || true
  die "nats not listening after ${WAIT_SECONDS}s"
}

stop_nats() {
  if [ -s "$NATS_DIR/nats.pid" ] && port_open "$NATS_PORT"; then
    log "stopping nats on 127.0.0.1:$NATS_PORT"
    nats-server --signal quit="$NATS_DIR/nats.pid" >/dev/null 2>&1 || true
    local i
    for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
      port_open "$NATS_PORT" || break
      sleep 0.1
    done
  fi
  rm -f "$NATS_DIR/nats.pid"
}

start() {
  [ "$(id -u)" = 0 ] || die "run as root (it installs packages and runs the servers as their users)"
  install_packages
  mkdir -p "$STATE"
  chmod 755 "$STATE"
  start_rabbitmq
  start_postgres
  start_redis
  start_nats
  wait_rabbitmq
  cat >"$STATE/env" <<EOF
export IDEMHTTP_POSTGRES_URL='postgres://postgres@127.0.0.1:$PG_PORT/$PG_DB?sslmode=disable'
export IDEMHTTP_REDIS_ADDR='127.0.0.1:$REDIS_PORT'
export IDEMHTTP_AMQP_URL='amqp://guest:guest@127.0.0.1:$AMQP_PORT/'
export IDEMHTTP_NATS_URL='nats://127.0.0.1:$NATS_PORT'
EOF
  cat "$STATE/env"
}

stop() {
  local bin
  stop_rabbitmq
  stop_nats
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
