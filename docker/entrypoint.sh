#!/bin/bash
# The image's entry point (under tini). Any command runs as given
# (`bitroute run`, `spark-class ...`, `sh`), except `executor`: the container
# command Spark on Kubernetes gives the executor pods it creates when the image
# is spark.kubernetes.container.image. Spark then describes the executor in the
# environment (SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, ...; its Java options in
# SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ... in order), as for the entry point of
# Spark's own Kubernetes image, and the executor is started from pyspark's jars.
set -euo pipefail

if [ "${1:-}" != executor ]; then
    exec "$@"
fi
shift

: "${SPARK_HOME:?SPARK_HOME is not set (the image sets it to the pyspark folder)}"
for name in SPARK_DRIVER_URL SPARK_EXECUTOR_ID SPARK_EXECUTOR_CORES SPARK_EXECUTOR_MEMORY \
            SPARK_APPLICATION_ID SPARK_EXECUTOR_POD_IP; do
    if [ -z "${!name:-}" ]; then
        echo "entrypoint: executor: $name is not set (Spark on Kubernetes sets it for executor pods)" >&2
        exit 2
    fi
done

# SPARK_JAVA_OPT_<n>, in the numeric order of n.
java_opts=()
while IFS= read -r name; do
    java_opts+=("${!name}")
done < <(compgen -e | grep '^SPARK_JAVA_OPT_[0-9]*$' | sort -t_ -k4 -n)

classpath="${SPARK_CONF_DIR:-$SPARK_HOME/conf}:$SPARK_HOME/jars/*"
if [ -n "${SPARK_EXTRA_CLASSPATH:-}" ]; then
    classpath="$classpath:$SPARK_EXTRA_CLASSPATH"
fi

pod=()
if [ -n "${SPARK_EXECUTOR_POD_NAME:-}" ]; then
    pod=(--podName "$SPARK_EXECUTOR_POD_NAME")
fi

exec java "${java_opts[@]}" \
    "-Xms$SPARK_EXECUTOR_MEMORY" "-Xmx$SPARK_EXECUTOR_MEMORY" \
    -cp "$classpath" \
    org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
    --driver-url "$SPARK_DRIVER_URL" \
    --executor-id "$SPARK_EXECUTOR_ID" \
    --cores "$SPARK_EXECUTOR_CORES" \
    --app-id "$SPARK_APPLICATION_ID" \
    --hostname "$SPARK_EXECUTOR_POD_IP" \
    --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
    "${pod[@]}" "$@"
