"""Run-time backends of khal_runtime (``cuda``, ``webgpu``): each one a package the generic
layer calls through its internal API."""
