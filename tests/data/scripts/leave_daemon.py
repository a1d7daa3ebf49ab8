"""A hostile wrapper for any script-mode command (issue 55, classes 1 and 4): it links a file from
outside the node's directories into the model directory, starts a daemon (fork, setsid, fork) that
would outlive the run, then becomes the command it wraps.

    python leave_daemon.py PIDS_DIR OUTSIDE_FILE python train.py ..."""

import os
import sys

pids, outside, command = sys.argv[1], sys.argv[2], sys.argv[3:]
node = os.environ["DLINFRA_NODE"]
os.symlink(outside, os.path.join(os.environ["DLINFRA_MODEL_DIR"], f"leak-{node}"))
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(os.path.join(pids, node), "w") as out:
            out.write(str(os.getpid()))
        os.execvp("python", ["python", "-c", "import time; time.sleep(900)", f"daemon-of-{node}"])
    os._exit(0)
os.wait()
os.execvp(command[0], command)
