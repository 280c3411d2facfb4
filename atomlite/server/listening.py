"""The server's listening socket, bound before the model loads."""
import errno
import socket

from atomlite.errors import ConfigError


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not listening yet), or a ConfigError saying why it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off only on connections of sockets that name it, and with it
    # on, each small write of a stream (an SSE event, a response body after its headers) waits for the client's
    # delayed ACK, about 40 ms
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is already in use (another server?): stop it or pick "
                              f"another --port") from None
        reason = e.strerror or e
        raise ConfigError(f"cannot listen on {host}:{port} ({reason}): pick another --host or --port") from None
    return sock
