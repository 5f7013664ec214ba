"""Open MLflow on Table 1: `make mlflow-ui`.

Writes the table's saved view into the store (the experiment tag
``mlflow.sharedViewState.darel-<profile>``: the profile's cell runs in the table's order,
Table 1's columns, ours beside the paper's; listed in the experiment's Views menu), runs
``mlflow ui`` on 127.0.0.1 (job execution off) as the MLflow app ``darel-ui``
(darel.tools.mlflow_app: MLflow's own app, whose start page makes model training the
browser's default and keeps the assistant panel closed on the table's view), and once the
server answers prints the address that opens the view and what its columns mean; it serves
until Ctrl-C. The address carries ``workflowType=machine_learning``, so it opens on the
training runs in any browser. From MLflow's home page the view takes three clicks: the
experiment, its Views menu, the view.

The address comes only after a GET of the server's start page succeeded, so the first
click works; if MLflow exits or does not answer within --wait seconds, its output is shown
with one line saying so. The server's chatter stays off the screen: its start-up log
(shown only when it fails to start), the deprecation warnings of its libraries and the
access log (a line per request), which would scroll the address away.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Iterable, Iterator

from darel import config
from darel.tracking import (TABLE_VIEW_COLUMNS, TrackingError, prepare_table_view, redacted, saved_view_name,
                            scrub, table_view_name, table_view_url)

# What Table 1's view shows, column by column (README, "Open MLflow").
TABLE1_LEGEND = ("the run's name ends in the budget (t0.80_m0.70: B(0.80, 0.70)); boost, drop (accuracy drop, "
                 "p.p.), mem (memory cut), CO2e (CO2e cut): ours, each followed by the paper's value for the same row "
                 "(`... paper`); adherence: measured time / t T; top1 in %; calibrated: batch/alpha/A/eta/epochs")

# uvicorn's access-log line, e.g. `127.0.0.1:56632 - "GET / HTTP/1.1" 200 OK`.
ACCESS_LOG = re.compile(r'"(?:GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS) \S+ HTTP/[\d.]+" \d{3}\b')


def clicks(experiment: str, profile: str, view_name: str | None = None) -> list[str]:
    """The same view from MLflow's home page (``view_name``: as saved in the store, which
    says GENERATED data where the runs' data label does)."""
    return [f"Experiments -> {experiment}",
            f"Views (top right) -> {view_name or table_view_name(experiment, profile)}"]


def announcement(experiment: str, experiment_id: str | None, profile: str, uri: str, base: str,
                 view_name: str | None = None) -> str:
    """What to open, and (Table 1) what the columns mean."""
    if experiment_id is None:
        return (f"MLflow: no experiment {experiment} in {redacted(uri)} yet (build the table first: make quick); "
                f"the store opens at {base}")
    text = (f"{experiment} ({profile} profile) in MLflow: open\n\n  {table_view_url(base, experiment_id, profile)}"
            "\n\nor from MLflow's home page: " + "; ".join(clicks(experiment, profile, view_name)))
    if experiment == "table1":
        text += f"\nColumns: {TABLE1_LEGEND}."
    return text


def quiet(lines: Iterable[str]) -> Iterator[str]:
    """The server's output lines less its libraries' deprecation warnings (each with the
    source line Python prints under it) and access-log lines."""
    after_warning = False
    for line in lines:
        if after_warning and line.startswith("  "):
            after_warning = False
            continue
        after_warning = "DeprecationWarning" in line
        if not after_warning and not ACCESS_LOG.search(line):
            yield line


class Relay:
    """Copies the server's output, through `quiet`, to `out` from a thread of its own; holds
    it until `release`, so that the start-up log never lands below the address."""

    def __init__(self, stream: IO[str], out: IO[str]) -> None:
        self.out = out
        self.held: list[str] = []
        self.live = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self.thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in quiet(stream):
            with self.lock:
                if self.live:
                    self.out.write(line)
                    self.out.flush()
                else:
                    self.held.append(line)

    def release(self, show_held: bool) -> None:
        """From now on, copy as it comes; before that, show what was held or drop it."""
        with self.lock:
            if show_held:
                self.out.write("".join(self.held))
                self.out.flush()
            self.held.clear()
            self.live = True


def wait_until_serving(url: str, server: subprocess.Popen, wait_s: float) -> str | None:
    """None once a GET of `url` answers 200; otherwise why not (the server exited, or did not
    answer within `wait_s` seconds)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # this machine: never a proxy
    deadline = time.monotonic() + wait_s
    while True:
        code = server.poll()
        if code is not None:
            return f"MLflow exited (code {code}) before it answered at {url}"
        try:
            with opener.open(url, timeout=5) as answer:
                if answer.status == 200:
                    return None
        except OSError:  # not listening yet, or not ready (an HTTP error is an OSError too)
            pass
        if time.monotonic() > deadline:
            return f"MLflow did not answer at {url} within {wait_s:g} s"
        time.sleep(0.5)


def server_command(mlflow: str, host: str, port: int) -> list[str]:
    # One worker: one person's browser needs no more, and MLflow's default of four starts
    # two to three times slower on 2 cores. No access log (a line per request).
    return [mlflow, "ui", "--app-name", "darel-ui", "--host", host, "--port", str(port), "--workers", "1",
            "--uvicorn-opts", "--no-access-log"]


def local_url(host: str, port: int) -> str:
    """The server's start page as this machine reaches it."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def stop(server: subprocess.Popen, grace_s: float = 30) -> None:
    """Stop the server (MLflow's command passes the signal on to its uvicorn) and wait for it."""
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _exit_on_sigterm(signum, frame) -> None:
    sys.exit(128 + signum)  # through `finally`, which stops the server


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--backend-store-uri", help="the MLflow store (default: tracking.uri of params.yaml)")
    ap.add_argument("--experiment", default="table1", choices=sorted(TABLE_VIEW_COLUMNS))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=int(os.environ.get("MLFLOW_PORT", "5000")))
    ap.add_argument("--wait", type=float, default=300, metavar="SECONDS",
                    help="how long to wait for the server to answer before giving up (default: 300)")
    ap.add_argument("--print-only", action="store_true", help="write the view and print the address; no server")
    args = ap.parse_args(argv)
    try:
        cfg = config.load_params(args.params)
    except config.ConfigError as err:
        sys.exit(f"{err}\n(nothing was run: correct {args.params})")
    uri, profile = args.backend_store_uri or cfg["tracking"]["uri"], cfg["profile"]
    try:
        experiment_id = prepare_table_view(uri, args.experiment, profile)
        view_name = saved_view_name(uri, experiment_id, profile) if experiment_id is not None else None
    except TrackingError as err:
        sys.exit(scrub(f"mlflow-ui: {err}"))
    text = announcement(args.experiment, experiment_id, profile, uri, f"http://{args.host}:{args.port}", view_name)
    if args.print_only:
        print(text)
        return
    print(f"mlflow-ui: starting MLflow on port {args.port} (seconds to a minute) ...", flush=True)
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    # The store through the environment, not the command line every user of the machine can read.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_BACKEND_STORE_URI": uri,
           "PYTHONUNBUFFERED": "1"}
    # Same process group: a Ctrl-C in the terminal reaches the server too.
    server = subprocess.Popen(server_command(mlflow, args.host, args.port), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, bufsize=1)
    relay = Relay(server.stdout, sys.stdout)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        problem = wait_until_serving(local_url(args.host, args.port), server, args.wait)
        if problem:
            relay.release(show_held=True)
            sys.exit(f"mlflow-ui: {problem}; its output is above")
        print(f"{text}\nMLflow serves the store until Ctrl-C.", flush=True)
        relay.release(show_held=False)
        code = server.wait()
        if code:
            sys.exit(f"mlflow-ui: MLflow exited with code {code}")
    except KeyboardInterrupt:
        pass  # the server got the Ctrl-C too and is shutting down
    finally:
        stop(server)
        relay.thread.join(timeout=5)


if __name__ == "__main__":
    main()
