"""A discrete-event simulation of the two-layer scheduler (``teola simulate``).

``trace``: what a query's graphs are and how long each primitive took alone (recorded by
the benchmark's bound runs); ``hardware``: engine-profile files of deployments this
machine cannot run; ``simulator``: the graph scheduler and the engine schedulers over
those traces, engines sharing the hardware of their compute group; ``calibration``:
predicted against measured latencies of the benchmark's systems.
"""
