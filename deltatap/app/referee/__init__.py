"""A wire-level referee for deltatap (issue 14, item 1).

Runs the whole chain -- ``deltatap load`` -> tap edge -> plain gateway -> tap gw-fw -> plain firewall
-> tap fw-engine -> plain engine (or llama.cpp) -> ``deltatap collect`` -- with every component an
ordinary aiohttp server, captures the loopback traffic with tcpdump (kernel stamps, ns), reassembles
every TCP stream and compares each point of every row in ``rows.parquet`` with the wire time of the
packet that carried the bytes the point is about.

Modules:

* :mod:`.pcap` -- a small reader for (nanosecond) pcap files: Ethernet / Linux cooked / null links,
  IPv4 and IPv6, TCP.
* :mod:`.reassembly` -- TCP streams by 4-tuple and sequence number (every data byte keeps the
  kernel stamp of the first segment that carried it), HTTP/1.1 messages on them (content-length
  and chunked bodies, decoded body offset -> stream offset) and the SSE events of a response.
* :mod:`.engines` -- the plain aiohttp engine and forwarding proxy (run as their own processes).
* :mod:`.capture` -- tcpdump start/stop.
* :mod:`.chain` -- launches the chain, the load, the collector and the capture; bounded, kills
  every child at the end.
* :mod:`.compare` -- the point -> packet mapping and the per point / per delta error statistics.

The CLI is ``benchmarks/wire_referee.py``; ``deltatap selftest`` uses it where a capture is allowed.
"""
