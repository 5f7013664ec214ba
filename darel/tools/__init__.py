"""Command-line tools around the workflow that are not stages of it: the DVC stage runner
(``python -m darel.tools.dvc_run``), the summary printed after a build
(``python -m darel.tools.summary``), the duration record a timed build writes of itself
(``python -m darel.tools.build_record``) and the GPU kit (``python -m darel.tools.gpu_kit``,
``make gpu-kit``)."""
