//! Conntrack for kproxy (work in progress).
