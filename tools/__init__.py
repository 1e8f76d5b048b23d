"""The tools built on the engine: the ``fastar`` command line, the demo, benchmarks, calibration and the demo
model's trainer. Nothing in ``fastar_core``, ``kernels`` or ``nodes`` imports from here."""
