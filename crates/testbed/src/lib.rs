//! Network-namespace sandboxes and the shared packet suite every dataplane runs.

pub mod kernel;
