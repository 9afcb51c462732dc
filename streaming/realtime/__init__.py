"""``streaming.mode = "realtime"``: a Spark Real-Time Mode query that routes in the JVM.

The executors route with ``io.bitroute.realtime.RouteUdf`` (``realtime/``, Java), which
calls the Rust kernel over JNI; :mod:`streaming.realtime.jar` builds the jar that carries
both (docs: /work/realtime-contract.md while the mode is being built).
"""
