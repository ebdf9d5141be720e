#!/usr/bin/env bash
# Counts, per request, the instructions and the simulated cache misses of
# each client of BenchmarkDo (root package) and each arm of BenchmarkICache
# (internal/icache), with valgrind's cachegrind: the client, net/http, the loopback
# server and the runtime together, as one round trip runs them.
#
#   bash bench/icache.sh                 # every arm, from the repository root
#   bash bench/icache.sh idemhttp raw+key
#
# Each arm runs twice, N1 and N2 requests (default 1000 and 5000), and the
# difference divided by N2 - N1 is what one request costs, start-up and
# connection set-up cancelled. GOGC=off keeps collections from falling on
# either side of the difference; GOMAXPROCS=1 and asyncpreemptoff=1 keep
# valgrind (which runs one thread at a time, and which Go's preemption
# signals stop) from changing what runs. The cache is the one valgrind
# finds in the CPU (cpuid): simulated, so the counts repeat whatever the
# load. Columns: instructions (Ir), first-level instruction cache misses
# (I1mr), first-level data cache misses (D1mr + D1mw) and last-level data
# misses (DLmr + DLmw). bench/README.md ("Where the client's loopback gap
# goes") turns them into time with BenchmarkICache.
set -euo pipefail

N1=${ICACHE_N1:-1000}
N2=${ICACHE_N2:-5000}
command -v valgrind >/dev/null || { echo "icache.sh: valgrind not found (apt-get install valgrind)" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go test -c -o "$dir/root.test" .
go test -c -o "$dir/icache.test" ./internal/icache

arms=("$@")
[ ${#arms[@]} -gt 0 ] || arms=(raw raw+key raw+key+trace retryablehttp retryablehttp+key idemhttp raw+key+hot raw+key+cold)

# totals ARM N prints "Ir I1mr D1 DL" of a run of N requests through ARM.
totals() {
	local bench=BenchmarkDo bin=root.test
	case $1 in raw+key+hot | raw+key+cold) bench=BenchmarkICache bin=icache.test ;; esac
	GOGC=off GODEBUG=asyncpreemptoff=1 GOMAXPROCS=1 valgrind --tool=cachegrind --cache-sim=yes \
		--cachegrind-out-file="$dir/cg.out" "$dir/$bin" -test.run '^$' \
		-test.bench "^$bench\$/^${1//+/\\+}\$" -test.benchtime="${2}x" >/dev/null 2>"$dir/err"
	grep -q 'I1  misses' "$dir/err" || { cat "$dir/err" >&2; exit 1; }
	awk '{gsub(",", "")}
		/I *refs:/ {ir = $4} /I1 *misses:/ {i1 = $4}
		/D1 *misses:/ {d1 = $4} /LLd *misses:/ {dl = $4}
		END {print ir, i1, d1, dl}' "$dir/err"
}

printf '%-20s %10s %8s %8s %8s\n' arm Ir I1mr D1m DLm
for arm in "${arms[@]}"; do
	read -r a1 b1 c1 d1 < <(totals "$arm" "$N1")
	read -r a2 b2 c2 d2 < <(totals "$arm" "$N2")
	awk -v n="$((N2 - N1))" -v arm="$arm" -v a="$((a2 - a1))" -v b="$((b2 - b1))" -v c="$((c2 - c1))" -v d="$((d2 - d1))" \
		'BEGIN {printf "%-20s %10.0f %8.0f %8.0f %8.1f\n", arm, a/n, b/n, c/n, d/n}'
done
