//! The table-driven packet suite every dataplane runs against real network namespaces.
