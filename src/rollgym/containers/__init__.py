"""Containers for agentic tasks: one seam (``runtime``), a local provider on podman, leases and a
reaper so nothing outlives its run, and images built without a registry."""
