"""The tap: a transparent HTTP/SSE reverse proxy that stamps the timeline into OpenTelemetry spans."""
