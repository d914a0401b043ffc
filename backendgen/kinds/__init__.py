"""The operator kinds a project registers (ATen kernels, the backend's own operators, autograd overrides),
and the registration file that holds them all."""
