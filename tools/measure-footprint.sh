#!/usr/bin/env bash
# Footprint of the device plugin at 8 GPUs: CPU share of one core and RSS, read from /proc.
#
#   tools/measure-footprint.sh [CARMA_BIN] [SECONDS] [--simulated-metrics nvml|gpm|dcgm]
#
# Runs `carma device-plugin --backend simulated --simulated-gpus 8x80GiB --sample-interval 1s`
# without an API server (2 synthetic pods per GPU carry the scripted load, so every GPU has pods,
# windows, per-pod series), scrapes /metrics every 15 s like Prometheus, waits 5 s, then measures
# over SECONDS (default 60). Prints one line: `footprint: <cpu> % of a core, RSS <mib> MiB (peak <mib> MiB), <n> threads`.
set -euo pipefail
BIN="${1:-target/debug/carma}"
SECS="${2:-60}"
shift $(( $# > 2 ? 2 : $# )) || true
EXTRA=("$@")
[ -x "$BIN" ] || { echo "measure-footprint: $BIN is not an executable (cargo build -p carma first)" >&2; exit 2; }
DIR="$(mktemp -d)"
PORT=$(( 20000 + RANDOM % 20000 ))
trap 'kill "$PID" 2>/dev/null || true; rm -rf "$DIR"' EXIT
env -u KUBECONFIG KUBERNETES_SERVICE_HOST= "$BIN" device-plugin --backend simulated --simulated-gpus 8x80GiB \
  --sample-interval 1s --device-plugin-dir "$DIR" --node-name footprint \
  --metrics-addr "127.0.0.1:$PORT" "${EXTRA[@]}" >"$DIR/log" 2>&1 &
PID=$!
HZ=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
scrape() { curl -fsS "http://127.0.0.1:$PORT/metrics" >/dev/null 2>&1 || true; }
sleep 5
kill -0 "$PID" 2>/dev/null || { echo "measure-footprint: the plugin exited:" >&2; cat "$DIR/log" >&2; exit 1; }
scrape
t0=$(ticks); s0=$(date +%s.%N)
end=$(( $(date +%s) + SECS ))
next=$(( $(date +%s) + 15 ))
while [ "$(date +%s)" -lt "$end" ]; do
  sleep 1
  if [ "$(date +%s)" -ge "$next" ]; then scrape; next=$(( next + 15 )); fi
done
t1=$(ticks); s1=$(date +%s.%N)
rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$PID/status")
hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$PID/status")
threads=$(awk '/^Threads:/ {print $2}' "/proc/$PID/status")
awk -v t="$(( t1 - t0 ))" -v hz="$HZ" -v s0="$s0" -v s1="$s1" -v rss="$rss" -v hwm="$hwm" -v th="$threads" \
  'BEGIN { wall = s1 - s0; printf "footprint: %.2f %% of a core (%.2f s CPU in %.1f s), RSS %.1f MiB (peak %.1f MiB), %d threads\n", 100 * t / hz / wall, t / hz, wall, rss / 1024, hwm / 1024, th }'
