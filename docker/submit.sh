#!/bin/sh
# Submit the router to a Spark cluster with spark-submit (client deploy mode:
# the driver runs here, as Spark requires for Python on a standalone master).
#
#   docker/submit.sh spark://spark-master:7077 [bitroute run options...]
#
# Needs bitroute installed in this Python (and in the workers' Python at the
# same path), and the BITROUTE_* settings of docs/running.md in the environment.
# SPARK_DRIVER_HOST (default: this host's name) must be reachable from the workers.
set -eu
master=${1:?usage: submit.sh SPARK_MASTER_URL [bitroute run options...]}
shift
python=${PYSPARK_PYTHON:-python3}
jars=$("$python" -c "from streaming import jvm; print(','.join(str(p) for p in jvm.jars('spark', quiet=True)))")
main=$("$python" -c "import streaming.cli.main as cli; print(cli.__file__)")
# bitroute keeps a local-mode driver on loopback; naming the cluster master
# here tells it the driver must be reachable from the workers.
export BITROUTE_SPARK_MASTER="$master"
exec spark-submit \
  --master "$master" \
  --deploy-mode client \
  --jars "$jars" \
  --conf "spark.driver.host=${SPARK_DRIVER_HOST:-$(hostname)}" \
  --conf spark.driver.bindAddress=0.0.0.0 \
  --conf "spark.pyspark.python=$python" \
  "$main" run "$@"
