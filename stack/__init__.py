"""The reference stack: gateway, AI firewall and engine that state the true times of their events."""
