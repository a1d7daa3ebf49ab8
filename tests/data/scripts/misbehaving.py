"""A script for script mode's failure modes, told by --mode what to do wrong. It imports no
TensorFlow (each case ends in seconds) and reads only what any script may: TF_CONFIG, the DLINFRA_*
variables."""

import argparse
import json
import os
import signal
import socket
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument(
    "--mode",
    required=True,
    choices=[
        "exit-on-worker-1",
        "hang",
        "alone",
        "alone-for-long",
        "no-model",
        "leave-behind",
        "sparse-checkpoint",
        "ignore-term",
    ],
)
parser.add_argument("--outside", help="leave-behind: a file outside the node's directories to link to")
parser.add_argument("--pids", help="leave-behind, ignore-term: where to write the daemon's pid")
args = parser.parse_args()
node = os.environ["DLINFRA_NODE"]
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
me = config["cluster"][task["type"]][task["index"]]


def serve_like_tensorflow():
    """Listen on this node's TF_CONFIG address, as a TensorFlow server would."""
    host, _, port = me.rpartition(":")
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, int(port)))
    server.listen()
    return server


def daemonize(ignore_term=False):
    """The classic daemon: fork, setsid, fork again, the middle one exits. Its pid goes to --pids."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(os.path.join(args.pids, node), "w") as out:
                out.write(str(os.getpid()))
            code = "import signal, time\n"
            code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else ""
            os.execvp("python", ["python", "-c", code + "time.sleep(600)", f"daemon-of-{node}"])
        os._exit(0)
    os.wait()


def hang_forever():
    while True:
        time.sleep(3600)


if args.mode == "exit-on-worker-1":
    server = serve_like_tensorflow()
    if node == "worker-1":
        time.sleep(2)
        print("ValueError: worker 1 found a label of 11 in a 10-class problem", file=sys.stderr)
        sys.exit(3)
    hang_forever()
elif args.mode == "hang":
    server = serve_like_tensorflow()
    hang_forever()  # waits for a peer that never comes, before its first step
elif args.mode in ("alone", "alone-for-long"):  # trains on its own copy of the data, ignoring TF_CONFIG
    time.sleep(1)
    with open(os.path.join(os.environ["DLINFRA_MODEL_DIR"], "model.txt"), "w") as out:
        out.write("a model trained alone\n")
    if args.mode == "alone-for-long":  # and goes on training, as a real one would, for ten minutes
        time.sleep(600)
elif args.mode == "no-model":  # leaves a note where the model goes, and no model
    server = serve_like_tensorflow()
    with open(os.path.join(os.environ["DLINFRA_MODEL_DIR"], "NOTES.txt"), "w") as out:
        out.write("notes: trained, model elsewhere\n")  # 32 bytes
    time.sleep(5)  # serving as a training run would, long enough for its agent's look (every 0.5 s)
elif args.mode == "leave-behind":  # a model, with links out of every output directory, and a daemon
    server = serve_like_tensorflow()
    env = os.environ
    with open(os.path.join(env["DLINFRA_MODEL_DIR"], "model.txt"), "w") as out:
        out.write("a model\n")
    for directory in ("DLINFRA_MODEL_DIR", "DLINFRA_CHECKPOINT_DIR", "DLINFRA_TENSORBOARD_DIR"):
        os.symlink(args.outside, os.path.join(env[directory], f"leak-{node}"))
    os.mkfifo(os.path.join(env["DLINFRA_MODEL_DIR"], "pipe"))
    daemonize()
    time.sleep(5)  # serving, as a training run would, long enough for its agent's look
elif args.mode == "sparse-checkpoint":  # 2 GB that take no disk, read as 2 GB of zeros
    server = serve_like_tensorflow()
    if node == "worker-0":
        with open(
            os.path.join(os.environ["DLINFRA_CHECKPOINT_DIR"], "ckpt-1.data-00000-of-00001"), "wb"
        ) as f:
            f.truncate(2 * 10**9)
    hang_forever()  # its agent ends it once the sync finds the directory past the cap
elif args.mode == "ignore-term":  # worker 1 ignores the stop, and so does the daemon it left
    server = serve_like_tensorflow()
    if node == "worker-0":
        time.sleep(3)
        with open(os.path.join(os.environ["DLINFRA_MODEL_DIR"], "model.txt"), "w") as out:
            out.write("a model\n")
    else:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        daemonize(ignore_term=True)
        hang_forever()
