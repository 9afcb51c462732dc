#!/usr/bin/env bash
# Install the comparison brokers, compile the C clients and build the Kafka Streams
# peer of the end-to-end benchmark.
#
# Debian packages: rabbitmq-server and mosquitto (the brokers; their services are
# NOT started by the install: the benchmark starts its own instances on loopback),
# librabbitmq-dev (rabbitmq-c) for the AMQP client, gcc to build both clients
# (the MQTT client speaks MQTT 3.1.1 over plain sockets: see clients/mqtt_bench.c),
# maven and openjdk-17-jdk-headless for the Kafka Streams peer (kstreams/pom.xml:
# its dependencies come from Maven Central into the local Maven repository on the
# first build; later builds run offline). Idempotent; run as root (or with sudo available).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${BITROUTE_E2E_BUILD:-$here/build}"
pkgs=(rabbitmq-server mosquitto librabbitmq-dev gcc maven openjdk-17-jdk-headless)

sudo_=""
if [ "$(id -u)" -ne 0 ]; then sudo_="sudo"; fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  # Keep the packages' init scripts from starting system-wide services.
  policy=/usr/sbin/policy-rc.d
  had_policy=0; [ -e "$policy" ] && had_policy=1
  if [ "$had_policy" -eq 0 ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo_ tee "$policy" >/dev/null
    $sudo_ chmod +x "$policy"
  fi
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq --no-install-recommends "${missing[@]}"
  if [ "$had_policy" -eq 0 ]; then $sudo_ rm -f "$policy"; fi
fi
# No `service ... stop` here: the rabbitmq-server init script runs rabbitmqctl,
# which starts a system epmd listening on every interface. The services were
# never started (policy-rc.d above); the benchmark runs its own instances.

mkdir -p "$build"
cflags=(-O2 -Wall -Wextra -std=gnu11)
gcc "${cflags[@]}" -o "$build/amqp_bench" "$here/clients/amqp_bench.c" -lrabbitmq -lm -lpthread
gcc "${cflags[@]}" -o "$build/mqtt_bench" "$here/clients/mqtt_bench.c" -lm
echo "built: $build/amqp_bench $build/mqtt_bench"

# The Kafka Streams peer: offline when the local repository has everything (every
# build after the first), else one online resolve from Maven Central. Bounded.
pom="$here/kstreams/pom.xml"
mvn_timeout="${BITROUTE_E2E_MAVEN_TIMEOUT:-900}"
if ! timeout "$mvn_timeout" mvn -B -q -o -f "$pom" package >"$build/kstreams-build.log" 2>&1; then
  echo "kstreams: offline build failed (first build?), resolving from Maven Central" >&2
  timeout "$mvn_timeout" mvn -B -q -f "$pom" package >"$build/kstreams-build.log" 2>&1 \
    || { echo "kstreams: build failed, see $build/kstreams-build.log" >&2; exit 1; }
fi
echo "built: $here/kstreams/target/kstreams-peer.jar"
