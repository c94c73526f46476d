"""clusterctl: the login-node side (spec, rank maps, submit, supervisor)."""

__version__ = "0.1.0"
