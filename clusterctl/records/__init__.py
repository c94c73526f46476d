"""Typed, versioned records for every file one clusterctl process writes and another reads."""
