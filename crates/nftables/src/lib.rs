//! The nftables dataplane: renders the plan into nf_tables transactions.
