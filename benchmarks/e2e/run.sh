#!/usr/bin/env bash
# The end-to-end table in one command (run by hand, never in CI):
#
#   benchmarks/e2e/run.sh [python -m benchmarks e2e options...]
#
# Installs RabbitMQ and Mosquitto from Debian's packages, compiles the C
# clients and builds the Kafka Streams peer (setup.sh), then runs bitroute, the
# Kafka Streams peer, RabbitMQ and Mosquitto (--systems) on the same workload,
# loopback only, and prints the table. Bounded: the whole run is
# stopped after BITROUTE_E2E_TIMEOUT seconds (default 5400), and everything it
# started is stopped with it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
"$here/setup.sh"
cd "$root"
python="${PYTHON:-$root/.venv/bin/python}"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec timeout --signal=TERM --kill-after=120 "${BITROUTE_E2E_TIMEOUT:-5400}" \
  "$python" -m benchmarks e2e "$@"
