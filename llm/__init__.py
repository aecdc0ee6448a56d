"""llama.cpp's real ``llama-server`` as a workload: a generated model (``model``), its podman
image (``image``), launching and talking to the server (``server``) and the demo's case
(``demo``). The tests, the benchmark and scripts/demo use it; whyrestart itself (``tracer``)
never does (tests/test_layering.py)."""
