"""clusterctl: the login-node side (spec, rank maps, submit, supervisor)."""
