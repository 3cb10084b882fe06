"""What the benchmark scripts share: a `tandem up` cluster started, waited for and stopped."""
import os
import signal
import subprocess
import sys
import time


def start_up(cmd, ready, what, timeout_s=960):
    """Runs `cmd` (a `tandem up ... --ready-file READY` command line) and returns the process once READY
    exists; exits the script, killing it, if it dies or is not ready in time (`what` names it)."""
    up = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout_s
    while not os.path.exists(ready):
        if up.poll() is not None or time.time() > deadline:
            up.kill()
            sys.exit(f"{what} failed to get ready: {up.stderr.read()[-2000:]}")
        time.sleep(0.2)
    return up


def stop_up(up, timeout_s=120):
    """Stops a cluster as Ctrl-C would (draining), killing it if it does not stop in time."""
    up.send_signal(signal.SIGINT)
    try:
        up.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        up.kill()
