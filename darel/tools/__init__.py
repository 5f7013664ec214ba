"""Command-line tools around the workflow that are not stages of it: the DVC stage runner
(``python -m darel.tools.dvc_run``) and the summary printed after a build
(``python -m darel.tools.summary``)."""
