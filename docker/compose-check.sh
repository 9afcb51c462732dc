#!/bin/bash
# The check docs/running.md ("docker/compose.yaml") records: the compose cluster
# up from the built image (bitroute:0.1.0), a subscription, eleven publishes
# routed on the executors (batches are not kept in the driver), the deliveries
# and audit rows counted, the router stopped with SIGTERM, everything removed.
# Exits non-zero when a count is wrong. Needs Docker and docker-compose (v1) or
# `docker compose` (COMPOSE="docker compose"); uses ports 8080 on the host.
set -u
cd "$(dirname "$0")/.."
export SPARK_WORKER_CORES=${SPARK_WORKER_CORES:-1} SPARK_WORKER_MEMORY=${SPARK_WORKER_MEMORY:-1g}
override=$(mktemp --suffix=.yaml)
trap 'rm -f "$override"' EXIT
cat > "$override" <<'YAML'
services:
  router:
    environment:
      BITROUTE_STREAMING_DRIVER_ROUTE_MAX_PUBLISHES: "0"
YAML
C="${COMPOSE:-docker-compose} -f docker/compose.yaml -f $override -p bitroute-check"
fail=0
t0=$(date +%s)
$C up -d 2>&1 | tail -1
until $C logs --no-color router 2>/dev/null | grep -q "Ctrl-C stops"; do
    sleep 2
    if [ $(( $(date +%s) - t0 )) -gt 300 ]; then echo "the router's query did not start in 300 s"; fail=1; break; fi
done
echo "query started $(( $(date +%s) - t0 )) s after up"
timeout 60 $C exec -T router bitroute subscribe --exchange amq.topic --subscriber billing --filter 'orders.*.paid'
t1=$(date +%s)
timeout 60 $C exec -T router bitroute publish --routing-key orders.eu.paid '{"order": 42}'
timeout 120 $C exec -T router bitroute tail billing --from-beginning --max 1 || fail=1
echo "first delivery read $(( $(date +%s) - t1 )) s after its publish"
for i in $(seq 1 10); do
    timeout 60 $C exec -T router bitroute publish --routing-key orders.us.paid "{\"order\": $i}" >/dev/null
done
deliveries=$(timeout 120 $C exec -T router bitroute tail billing --from-beginning --max 11 2>/dev/null | wc -l)
echo "deliveries: $deliveries (expected 11)"; [ "$deliveries" = 11 ] || fail=1
rows=""
for _ in $(seq 1 15); do
    rows=$(timeout 60 $C exec -T router bitroute audit deliveries | grep -c '^bitroute.publishes/')
    [ "$rows" = 11 ] && break; sleep 2
done
echo "audit rows: $rows (expected 11)"; [ "$rows" = 11 ] || fail=1
$C logs --no-color router | grep -E "batch [0-9]+:" | sed 's/^[^|]*| //'
if $C logs --no-color router | grep -E "batch [0-9]+: [1-9]" | grep -qv "routed in the executors"; then
    echo "a batch with publishes was not routed in the executors"; fail=1
fi
$C stop router 2>&1 | tail -1
code=$(docker inspect "$($C ps -q router)" --format '{{.State.ExitCode}}')
echo "router exit code after SIGTERM: $code"; [ "$code" = 0 ] || fail=1
$C down -v 2>&1 | tail -1
echo "$(( $(date +%s) - t0 )) s; $([ $fail = 0 ] && echo passed || echo FAILED)"
exit $fail
