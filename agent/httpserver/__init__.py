"""The agent's HTTP/1.1 server: GET only, every resource a network peer can take bounded.

One thread (the IO loop) accepts, reads request heads and writes responses, non-blocking,
for every connection. So a connection costs a file descriptor and at most MAX_HEAD_BYTES
of buffer, never a thread, however slowly it sends or reads (docs/scale.md, "The agent's
HTTP side"):

- **Whole-request deadlines.** A request head must be complete within `head_timeout_s`
  of the connection's accept, or of the first byte of the next request on a kept-alive
  connection; a response must be taken within `write_timeout_s`; a kept-alive connection
  silent for `idle_timeout_s` is closed. Requests carry no body (GET only).
- **Connections.** At most `max_connections` are open. Beyond, a new connection closes
  the one waiting longest (reading a head, idle, or being written), those whose last
  request did not prove the token first: a flood of slow clients pushes out itself, not
  the controller.
- **Pools.** The router sends each request either an answer made at once (401, 404, 400:
  cheap) or a `Work` for a named pool, whose requests in flight (being computed or
  written) are capped at `slots`; beyond, 503 and close. Pools do not share slots. A
  pool's answers are computed on its own worker threads, or with `workers=0` on the IO
  loop itself: no thread handoff, for short answers that should leave at once (a handoff
  there and back cost a pull more CPU than the answer itself).
- **One send per response.** The head and body leave in one buffer, on sockets with
  TCP_NODELAY: a head and a body in two sends meet Nagle's algorithm and the client's
  delayed ACK (~40 ms per request when requests follow each other at once).
"""

from azprobe.agent.httpserver.connections import ConnectionLimits
from azprobe.agent.httpserver.pools import Pool, Work
from azprobe.agent.httpserver.server import BoundedHTTPServer, Router
from azprobe.agent.httpserver.wire import (MAX_HEAD_BYTES, MAX_HEADERS, HeadError, Request, Response, encode_response,
                                           error_response, has_body, parse_head)

__all__ = ["MAX_HEADERS", "MAX_HEAD_BYTES", "BoundedHTTPServer", "ConnectionLimits", "HeadError", "Pool", "Request",
           "Response", "Router", "Work", "encode_response", "error_response", "has_body", "parse_head"]
