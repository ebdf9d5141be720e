#!/usr/bin/env bash
# Runs BenchmarkTxMiddlewareInterleaved against a private PostgreSQL with
# pg_stat_statements loaded, then prints what the server spent per
# statement, and its processes' CPU time in all:
#
#   bash contrib/postgres/tx_bench.sh                 # 5 runs of 2000 iterations
#   RUNS=7 BENCHTIME=4000x bash contrib/postgres/tx_bench.sh
#   TEST_BINARY=/path/to/postgres.test bash contrib/postgres/tx_bench.sh
#   TEST_BINARY="before.test after.test" bash contrib/postgres/tx_bench.sh
#
# With several test binaries (built by go test -c from two commits, say),
# the runs alternate between them, one run each in turn, each line of the
# output after the binary's name, so that both meet the same load.
#
# The server is initdb'ed afresh in a temporary directory, listens on
# 127.0.0.1:$PORT (default 5499) only, runs with the same settings as the
# one .ci/services.sh starts (fsync and synchronous_commit on) plus
# pg_stat_statements, which needs shared_preload_libraries and so a server
# of its own, and is stopped and deleted at the end. Run as root (the
# server runs as the postgres user) or as a user that may run initdb.
#
# The benchmark reports per run: tx-throughput-ratio (plain latency / tx
# latency), pg-cpu-plain-us and pg-cpu-tx-us (the CPU time of the backends
# of each side's pool per request, from /proc/PID/schedstat), pg-cpu-ratio
# and hot-update-% (of the key table's updates). The statement table
# below covers every run together; the background line is the CPU time of
# the server's other processes (WAL writer, checkpointer, autovacuum...),
# which both sides share.
set -euo pipefail

PORT=${PORT:-5499}
RUNS=${RUNS:-5}
BENCHTIME=${BENCHTIME:-2000x}
BENCH=${BENCH:-BenchmarkTxMiddlewareInterleaved}
HERE=$(cd "$(dirname "$0")" && pwd)

bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -x "$bin/initdb" ] || { echo "tx_bench.sh: PostgreSQL binaries not found under /usr/lib/postgresql" >&2; exit 1; }

dir=$(mktemp -d)
run_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
[ "$(id -u)" = 0 ] && chown postgres "$dir"
cleanup() {
  run_pg "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

run_pg "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 ||
  { cat "$dir/initdb.log" >&2; exit 1; }
run_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
  -o "-p $PORT -c listen_addresses=127.0.0.1 -k $dir -c max_connections=300 \
      -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all \
      -c pg_stat_statements.track_utility=on" start >/dev/null
psql=("$bin/psql" -X -h 127.0.0.1 -p "$PORT" -U postgres)
"${psql[@]}" -d postgres -qc "CREATE DATABASE idemtest"
"${psql[@]}" -d idemtest -qc "CREATE EXTENSION pg_stat_statements"

# cpu_ns: the CPU time of every process of the server so far, in ns: the
# postmaster's and its live children's (schedstat), plus the children
# that ended (cutime and cstime of the postmaster, in clock ticks).
cpu_ns() {
  local pm ticks sum=0 pid
  pm=$(head -n 1 "$dir/data/postmaster.pid")
  ticks=$(getconf CLK_TCK)
  sum=$(awk '{print $1}' "/proc/$pm/schedstat")
  for pid in $(pgrep -P "$pm"); do
    sum=$((sum + $(awk '{print $1}' "/proc/$pid/schedstat" 2>/dev/null || echo 0)))
  done
  read -r cu cs < <(awk '{print $16, $17}' "/proc/$pm/stat")
  echo $((sum + (cu + cs) * 1000000000 / ticks))
}

export IDEMHTTP_POSTGRES_URL="postgres://postgres@127.0.0.1:$PORT/idemtest?sslmode=disable"
if [ -n "${TEST_BINARY:-}" ]; then
  read -r -a binaries <<<"$TEST_BINARY"
else
  (cd "$HERE" && go test -c -o "$dir/postgres.test" .)
  binaries=("$dir/postgres.test")
fi
"${psql[@]}" -d idemtest -qAtc "SELECT pg_stat_statements_reset()" >/dev/null
before=$(cpu_ns)
if [ "${#binaries[@]}" = 1 ]; then
  (cd "$HERE" && "${binaries[0]}" -test.run '^$' -test.bench "$BENCH" -test.benchmem \
    -test.count "$RUNS" -test.benchtime "$BENCHTIME") | tee "$dir/bench.txt"
else
  for ((run = 1; run <= RUNS; run++)); do
    for b in "${binaries[@]}"; do
      (cd "$HERE" && "$b" -test.run '^$' -test.bench "$BENCH" -test.benchmem \
        -test.count 1 -test.benchtime "$BENCHTIME") | grep '^Benchmark' | sed "s|^|$(basename "$b") |"
    done
  done | tee "$dir/bench.txt"
fi
after=$(cpu_ns)

echo
echo "# the server's CPU time over the whole run: $(((after - before) / 1000000)) ms"
echo "# per statement (all runs; calls, mean and total execution time, WAL bytes, rows):"
"${psql[@]}" -d idemtest -P pager=off -c "
SELECT calls, round(mean_exec_time::numeric * 1000, 1) AS mean_us,
       round(total_exec_time::numeric) AS total_ms, wal_bytes, rows,
       regexp_replace(left(query, 90), '\s+', ' ', 'g') AS query
FROM pg_stat_statements
WHERE calls >= 100
ORDER BY total_exec_time DESC LIMIT 20"
