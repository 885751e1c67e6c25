"""jmamba replicas under Ray Serve, routed by prefix (`jmamba serve --ray-replicas N`).

- `application.py`: the Serve application, its router (which, and why) and the command's loop;
- `ingress.py`: the HTTP front, one Serve replica relaying each request to a jmamba replica;
- `replica.py`: `JmambaReplica`, a whole `jmamba serve` app in a replica's process;
- `exchange.py`: one forwarded request through that app, its response streamed as it is sent;
- `forwarded.py`: the forwarded request and the routing text the prefix router matches.

Needs the `ray` extra (pip install 'jmamba[ray]': Ray Serve, no vLLM). This file imports no Ray:
the command registers its options from here.
"""

ROUTINGS = ("prefix", "power-of-two")  # prefix affinity; Serve's default (by load alone)
