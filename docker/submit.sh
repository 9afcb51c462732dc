#!/bin/sh
# Submit the router to a Spark cluster with spark-submit (client deploy mode:
# the driver runs here, as Spark requires for Python on a standalone master).
#
#   docker/submit.sh spark://spark-master:7077 [bitroute run options...]
#
# Needs the `bitroute` command on PATH (the Python it runs with is the driver's,
# with pyspark's spark-submit beside it) and the BITROUTE_* settings of
# docs/running.md in the environment. The executors get bitroute, its kernel and
# its dependencies from the application: `bitroute pack` builds the packed
# environment once (then reuses it) and the driver hands it to them
# (spark.archives); a worker needs only Java 17 and the Python `bitroute pack`
# names. Realtime mode's JVM side (bitroute-realtime.jar, its native library
# inside) goes with the application's jars. SPARK_DRIVER_HOST (default: this
# host's name) must be reachable from the workers.
set -eu
master=${1:?usage: submit.sh SPARK_MASTER_URL [bitroute run options...]}
shift
bitroute=$(command -v bitroute) || {
  echo "submit.sh: no bitroute command on PATH: activate the environment bitroute is installed in" >&2
  exit 2
}
# pip writes the interpreter of the environment into its commands' #! line
# (or, for a long path, a /bin/sh line that execs it: then it is the python beside).
python=$(sed -n '1s/^#!//p' "$bitroute")
case "$python" in */sh|"") python=$(dirname "$bitroute")/python ;; esac
"$python" -c "import streaming.cli.main" 2>/dev/null || {
  echo "submit.sh: $python (the Python of $bitroute) cannot import bitroute" >&2
  exit 2
}
submit=$(dirname "$python")/spark-submit
[ -x "$submit" ] || submit=spark-submit
# The executors' environment: built now (progress and summary on stderr) rather
# than by the driver after spark-submit's start.
"$bitroute" pack >&2
# The Kafka connector's jars and realtime mode's (built now if its sources changed;
# left out where this host cannot build it: micro-batch mode does without it, and a
# realtime router then refuses at start with one line).
jars=$("$python" -c "from streaming.session import router_jars; print(','.join(str(p) for p in router_jars()))")
main=$("$python" -c "import streaming.cli.main as cli; print(cli.__file__)")
# spark-submit's JVM is the driver's: bitroute's logging, and the options of a driver
# that only plans and schedules (docs/running.md, "Where a batch is routed").
java_options=$("$python" -c "from streaming import session as s; print(f'-Dlog4j2.configurationFile={s.LOG4J2_CONFIG} {s.CLUSTER_DRIVER_JAVA_OPTIONS}')")
# The session takes the master from spark-submit (BITROUTE_SPARK_MASTER is not needed).
exec "$submit" \
  --master "$master" \
  --deploy-mode client \
  --jars "$jars" \
  --conf "spark.driver.host=${SPARK_DRIVER_HOST:-$(hostname)}" \
  --conf spark.driver.bindAddress=0.0.0.0 \
  --conf "spark.pyspark.driver.python=$python" \
  --driver-java-options "$java_options" \
  "$main" run "$@"
