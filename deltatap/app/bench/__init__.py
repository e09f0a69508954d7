"""``deltatap bench <test>``: the methodology draft's tests (§5.1-5.10) as commands, each attributed per component."""
