"""Realtime mode (``streaming.mode = "realtime"``): bitroute on Spark's Real-Time Mode.

- :mod:`streaming.realtime.service`: what the router runs in this mode, beside the state
  it shares with micro-batch mode;
- :mod:`streaming.realtime.view`: the applied subscriptions, from the driver to the
  executors' matchers (the routing view topic), and happens-before;
- :mod:`streaming.realtime.query`: the routing query (Kafka -> the JVM route function
  on the Rust kernel -> Kafka);
- :mod:`streaming.realtime.audit`: the routed records, read back into the Delta audit
  exactly once;
- :mod:`streaming.realtime.jar`: the JVM side's jar (``realtime/`` compiled, with the
  kernel's JNI library inside), built by ``bitroute jars``.

The JVM side is ``realtime/`` (Java) over ``kernel/jni`` (the Rust kernel's JNI face).
"""
