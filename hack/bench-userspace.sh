#!/usr/bin/env bash
# Runs the userspace backend's benchmarks (backends/userspace/bench_linux_test.go)
# and prints the medians side by side: the direct path, the userspace proxier
# (in its own process, and in the benchmark's process), HAProxy in TCP mode;
# then the proxier at 100 and 10,000 services. See docs/benchmarks.md,
# "userspace backend". No Kubernetes control plane is needed.
#
#   sudo hack/bench-userspace.sh [COUNT] [SCALE_COUNT]
#
# COUNT (default 5) is the number of runs of the data-path benchmarks,
# SCALE_COUNT (default 3) of the scale benchmark. Must run as root (network
# namespaces); installs haproxy with apt-get when it is missing. The raw
# output goes to $OUT (default bench-userspace.txt in the current directory).
set -euo pipefail

count=${1:-5}
scale_count=${2:-3}
out=${OUT:-$PWD/bench-userspace.txt}
repo=$(cd "$(dirname "$0")/.." && pwd)

if [ "$(id -u)" != 0 ]; then
  echo "bench-userspace: must run as root (the benchmarks create network namespaces)" >&2
  exit 1
fi
if ! command -v haproxy >/dev/null; then
  echo "bench-userspace: installing haproxy" >&2
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy >/dev/null
fi
# The Debian package may start its own haproxy: ours runs in a namespace
# and does not need it, but leave it alone.

bin=$(mktemp -d)
sampler=
trap 'rm -rf "$bin"; [ -z "$sampler" ] || kill "$sampler" 2>/dev/null || true' EXIT
(cd "$repo" && go test -c -o "$bin/userspace.test" ./backends/userspace/)

export KPNG_REQUIRE_PRIVILEGED=1 # fail rather than skip (no root, no haproxy)
{
  echo "# $(date -u +%FT%TZ) $(git -C "$repo" rev-parse --short HEAD) $(go version)"
  echo "# nproc $(nproc), kernel $(uname -r), haproxy $(haproxy -v | head -n 1)"
  lscpu | head -n 15 | sed 's/^/# /'
  echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out"
cd "$repo/backends/userspace"
# The machine's load during the run (1-minute load average every 10 s).
(while sleep 10; do cut -d' ' -f1 /proc/loadavg; done) > "$bin/load" &
sampler=$!
# One process per run, each measuring every path in turn: the ratios are
# between figures taken one after the other. (With -test.count=N, Go would
# run each sub-benchmark N times in a row, all the direct runs first.)
for i in $(seq "$count"); do
  echo "bench-userspace: data path, run $i of $count" >&2
  "$bin/userspace.test" -test.run '^$' -test.bench 'BenchmarkUserspace(Throughput|RequestResponse|Connect)$' \
    -test.benchtime=1s -test.count=1 -test.timeout=30m | tee -a "$out"
done
for i in $(seq "$scale_count"); do
  echo "bench-userspace: scale, run $i of $scale_count" >&2
  "$bin/userspace.test" -test.run '^$' -test.bench 'BenchmarkUserspaceScale$' \
    -test.benchtime=1000x -test.count=1 -test.timeout=30m | tee -a "$out"
done
kill "$sampler" 2>/dev/null || true
sampler=
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out"
echo "# load during the run (1-minute average every 10 s): $(sort -n "$bin/load" | sed -n '1p;$p' | paste -sd-), median $(sort -n "$bin/load" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')" >> "$out"

# The medians of every figure, by benchmark, then the targets.
awk '
function median(key,   n, i, j, v, a) {
  n = cnt[key]
  if (n == 0) return ""
  for (i = 1; i <= n; i++) a[i] = vals[key, i]
  for (i = 2; i <= n; i++) { v = a[i]; for (j = i - 1; j >= 1 && a[j] > v; j--) a[j + 1] = a[j]; a[j + 1] = v }
  if (n % 2) return a[(n + 1) / 2]
  return (a[n / 2] + a[n / 2 + 1]) / 2
}
function m(name, unit) { return median(name SUBSEP unit) }
function fmt(v) { return v == "" ? "-" : (v >= 1000 || v <= -1000 ? sprintf("%.0f", v) : sprintf("%.3g", v)) }
function row(label, bench, unit, paths,   n, p, i, s) {
  n = split(paths, p, " ")
  s = sprintf("%-34s", label)
  for (i = 1; i <= n; i++) s = s sprintf(" %16s", fmt(m(bench "/" p[i], unit)))
  print s
}
function target(what, ok, measured) {
  printf "%-70s %-8s %s\n", what, (measured == "" ? "n/a" : (ok ? "met" : "NOT met")), measured
}
/^Benchmark/ {
  name = $1; sub(/-[0-9]+$/, "", name)
  if (!(name in seen)) { seen[name] = 1; order[++names] = name }
  for (i = 3; i < NF; i += 2) { key = name SUBSEP $(i + 1); vals[key, ++cnt[key]] = $i; units[name] = units[name] " " $(i + 1) }
}
END {
  print ""
  print "Medians (runs per figure in parentheses):"
  for (k = 1; k <= names; k++) {
    name = order[k]; split(units[name], us, " "); line = ""; delete done
    for (u = 1; u in us; u++) {
      if (us[u] in done || us[u] == "ns/op") continue
      done[us[u]] = 1
      line = line sprintf("  %s %s (%d)", fmt(m(name, us[u])), us[u], cnt[name SUBSEP us[u]])
    }
    printf "%-52s%s\n", name, line
  }
  paths = "direct userspace userspace-inproc haproxy"
  print ""
  printf "%-34s %16s %16s %16s %16s\n", "Side by side (medians)", "direct", "userspace", "userspace-inproc", "haproxy"
  row("throughput, Gbit/s", "BenchmarkUserspaceThroughput", "Gbit/s", paths)
  row("  ratio to direct", "BenchmarkUserspaceThroughput", "ratio-to-direct", paths)
  row("request/response p50, us", "BenchmarkUserspaceRequestResponse", "p50-us", paths)
  row("  p99, us", "BenchmarkUserspaceRequestResponse", "p99-us", paths)
  row("  p50 added to direct, us", "BenchmarkUserspaceRequestResponse", "added-p50-us", paths)
  row("connections/s, 1 client", "BenchmarkUserspaceConnect/clients=1", "conn/s", paths)
  row("  ratio to direct", "BenchmarkUserspaceConnect/clients=1", "ratio-to-direct", paths)
  row("connections/s, 4 clients", "BenchmarkUserspaceConnect/clients=4", "conn/s", paths)
  row("  ratio to direct", "BenchmarkUserspaceConnect/clients=4", "ratio-to-direct", paths)
  print ""
  printf "%-34s %16s %16s\n", "Scale (medians)", "100 services", "10,000 services"
  split("first-sync-ms addr-ms listen-ms change-p50-us change-p99-us heap-MiB stack-MiB rss-MiB rss-total-MiB fds goroutines", sc, " ")
  for (i = 1; i in sc; i++)
    printf "%-34s %16s %16s\n", sc[i], fmt(m("BenchmarkUserspaceScale/services=100", sc[i])), fmt(m("BenchmarkUserspaceScale/services=10000", sc[i]))

  print ""
  print "Targets (userspace = the proxier in its own process; medians of the per-run figures):"
  t = "BenchmarkUserspaceThroughput"; r = "BenchmarkUserspaceRequestResponse"
  v = m(t "/userspace", "ratio-to-direct"); target("one TCP stream: throughput >= 0.5 x direct", v >= 0.5, v)
  v = m(r "/userspace", "added-p50-us"); target("request/response: p50 added to direct <= 15 us", v != "" && v <= 15, v)
  for (c = 1; c <= 4; c += 3) {
    v = m("BenchmarkUserspaceConnect/clients=" c "/userspace", "ratio-to-direct")
    target("new connections/s >= 0.5 x direct, " c " client(s)", v >= 0.5, v)
  }
  v = m(t "/haproxy", "ratio-to-userspace"); target("throughput >= HAProxy (HAProxy / userspace <= 1)", v != "" && v <= 1, v)
  for (c = 1; c <= 4; c += 3) {
    v = m("BenchmarkUserspaceConnect/clients=" c "/haproxy", "ratio-to-userspace")
    target("connections/s >= HAProxy, " c " client(s) (HAProxy / userspace <= 1)", v != "" && v <= 1, v)
  }
  v = m(r "/haproxy", "vs-userspace-p50-us"); target("latency no worse than HAProxy (HAProxy p50 - userspace p50 >= 0 us)", v != "" && v >= 0, v)
  for (n = 100; n <= 10000; n *= 100) {
    v = m("BenchmarkUserspaceScale/services=" n, "change-p50-us")
    target("one endpoint change < 1 ms (p50 us), " n " services", v != "" && v < 1000, v)
  }
  a = m("BenchmarkUserspaceScale/services=100", "change-p50-us"); z = m("BenchmarkUserspaceScale/services=10000", "change-p50-us")
  if (a != "" && z != "") printf "%-70s %-8s %.3g\n", "one endpoint change, p50 at 10,000 / p50 at 100 services", "(info)", z / a
}' "$out"
echo
grep '^# load' "$out"
echo "raw output: $out"
