"""JVM options of the Spark processes that scenario tests start for themselves.

A test's JVM lives for a minute or two, mostly starting up: C2, the optimising JIT, spends
CPU compiling code that will not run long enough to repay it, and G1 runs threads of its
own. With C1 only and the serial collector, a local-cluster scenario (a driver and two
executor JVMs) took 52 CPU-seconds instead of 86 on this project's 2-core test machine
(2026-11-27), running the same steps.
"""

from __future__ import annotations

LIGHT_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def light_jvm_conf(executors: bool = False) -> dict[str, str]:
    """Spark settings that start the driver's JVM (and the executors', if any) light."""
    conf = {"spark.driver.extraJavaOptions": LIGHT_JVM}
    if executors:
        conf["spark.executor.extraJavaOptions"] = LIGHT_JVM
    return conf
