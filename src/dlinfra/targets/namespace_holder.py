"""The process that holds a private network namespace (targets.private_network): it brings the
namespace's loopback up, says `ready`, and lives until its stdin closes.

It imports nothing but the standard library and runs with `python -I -S`: the CLI waits for its
`ready` before it starts any node, and an import of dlinfra (pydantic, the spec's models) made that
wait 0.16 s instead of 0.02.
"""

import fcntl
import socket
import struct
import sys

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    """`ip link set lo up` without iproute2: a new namespace's loopback starts down."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))


if __name__ == "__main__":
    loopback_up()
    print("ready", flush=True)
    sys.stdin.buffer.read()  # until the CLI closes the pipe or exits
