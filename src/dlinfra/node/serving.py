"""What a worker or ps of the parameter-server strategy runs: a TensorFlow gRPC server, nothing more.

The chief sends such a node every op it executes, so the node's Python never touches Keras, tf.data
or the model. `import tensorflow` costs about 4.5 s of CPU (its whole API, and through it Keras,
scikit-learn and SciPy); the server's own modules cost 0.6 s. With four serving nodes on a 2-core
machine that was most of the time to the first step. So a serving node without GPUs loads only the
server, by importing its modules under a bare `tensorflow` package (its directory, without the
top-level __init__ that loads the API). A node with GPUs loads all of TensorFlow: it must check
that TensorFlow sees them (node.devices).

This reaches into TensorFlow's layout (tensorflow.python.training.server_lib), which has stayed put
since TF 1; dlinfra pins TensorFlow's minor version, and the PS tests run every serving node this way.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

from dlinfra.contract import NodeConfig
from dlinfra.node.niceness import in_nicer_thread

# How much nicer than its process a serving node loads the server's modules (node.niceness): where
# nodes share a machine (a local run), the four servers' loads took two fifths of the chief's core
# while it loaded TensorFlow.
LOAD_NICENESS = 10


def start_server(cluster: dict[str, list[str]], role: str, index: int, threads: int, *, lean: bool) -> Any:
    """A started gRPC server for task `role` `index`; `threads`: its sessions' inter-op pool (0:
    TensorFlow's choice). `lean`: load only the server's modules (see the module's doc)."""
    server_lib, config_pb2 = _lean_modules() if lean else _full_modules()
    return server_lib.Server(
        server_lib.ClusterSpec(cluster),
        job_name=role,
        task_index=index,
        protocol="grpc",
        # a server's sessions take their pools from this, not from tf.config.threading
        config=config_pb2.ConfigProto(inter_op_parallelism_threads=threads),
        start=True,
    )


def start_data_worker(cfg: NodeConfig, *, lean: bool) -> Any:
    """A parameter-server worker's tf.data service worker, started in this process, or None where the
    workers take no files from the chief (NodeConfig.dispatcher). The workers' pipeline, traced by the
    chief, reads from it (target_workers LOCAL) the train files it asks the dispatcher for as it is
    free (training.dispatch.dispatched_records). It must be up before the node serves: the chief
    builds the pipeline once it reaches the node."""
    if not cfg.takes_dispatched_files:
        return None
    if lean:
        _lean_modules()
    from tensorflow.python.data.experimental.service import server_lib as data_server_lib

    # any free port: only this process's own reader reads from it
    address = f"{cfg.address.rpartition(':')[0]}:%port%"
    config = data_server_lib.WorkerConfig(str(cfg.dispatcher), worker_address=address, port=0)
    server = data_server_lib.WorkerServer(config)
    print(f"taking train files from the chief's tf.data dispatcher at {cfg.dispatcher}", flush=True)
    return server


def _full_modules() -> tuple[Any, Any]:
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.training import server_lib

    del tf  # imported for its side effects: the whole runtime, as any TensorFlow program has it
    return server_lib, config_pb2


def _lean_modules() -> tuple[Any, Any]:
    if "tensorflow.python.training.server_lib" not in sys.modules:
        import numpy  # noqa: F401  # here: its BLAS threads, made as it loads, live as long as the process

        in_nicer_thread(_load_lean, LOAD_NICENESS, "server-load")  # its ImportError raised here
    return _load_lean()


def _load_lean() -> tuple[Any, Any]:
    if "tensorflow" not in sys.modules:
        spec = importlib.util.find_spec("tensorflow")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("TensorFlow is not installed. Fix: pip install 'dlinfra[train]'")
        package = types.ModuleType("tensorflow")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["tensorflow"] = package
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.training import server_lib

    return server_lib, config_pb2
