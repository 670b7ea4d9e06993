//! The plan: what every dataplane renders, computed from the cluster state with no I/O, and its diff.
