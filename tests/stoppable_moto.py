"""A moto server that can go down and come back on the same port: an S3 (or EC2) outage as clients
meet it, for tests and for bench/bench_chaos.py. moto's own stop leaves its socket listening, where a
client would hang in the backlog instead of being refused, so going down closes it too."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any


class StoppableMoto:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request would bury the rest
        self.server: Any = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        self.port = int(self.server.get_host_and_port()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.up_now = True

    def down(self) -> None:
        """Refused from now on."""
        self.server.stop()
        self.server._server.server_close()
        self.up_now = False

    def up(self) -> None:
        """Answering again, with what it held (moto's state lives in this process, not the server)."""
        from moto.server import ThreadedMotoServer

        while True:  # moto's server thread dies on a port still taken, and start() would wait forever
            try:
                socket.create_server(("127.0.0.1", self.port)).close()
                break
            except OSError:
                time.sleep(0.2)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        self.up_now = True

    def stop(self) -> None:
        if self.up_now:
            self.server.stop()
            self.server._server.server_close()
            self.up_now = False


def freeing_private_ips(terminate: Any) -> Any:
    """moto's InstanceBackend.terminate_instances, freeing each terminated instance's private IP as AWS
    does (moto keeps it taken until the instance object is collected), so a replacement can take it."""

    def terminate_and_free(self: Any, instance_ids: list[str]) -> Any:
        done = terminate(self, instance_ids)
        for instance, _ in done:
            self.get_subnet(instance.subnet_id).del_subnet_ip(instance.private_ip)
        return done

    return terminate_and_free
