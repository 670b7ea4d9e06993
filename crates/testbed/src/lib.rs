//! Network-namespace sandboxes for tests that send real packets through a real kernel.
//!
//! Every dataplane (nftables, iptables, IPVS in a guest kernel) is checked by the same
//! table-driven packet cases; this crate is the ground they run on:
//!
//! - [`Netns`]: a named network namespace, deleted on drop and on panic, that Rust code can
//!   enter per thread ([`Netns::run_in`]).
//! - [`Testbed`]: the standard dual-stack topology — `node` (where the proxy runs), `node2`,
//!   `external`, and pods ([`Testbed::add_pod`]) — with addresses in [`topology`].
//! - [`EchoServer`] / [`Pod::serve`]: backends that answer `<name> <peer-ip> <peer-port>`.
//! - [`probe`], [`probe_many`], [`UdpSession`]: real client traffic, reduced to a
//!   [`ProbeResult`] (who answered and which source it saw, or refused / unreachable / dropped).
//! - [`send_tcp_segments`], [`SegmentTap`]: hand-made TCP segments (say, a bare FIN conntrack
//!   deems INVALID) and where they arrive.
//! - [`chi_square_uniform`] and friends for "is the spread even" assertions.
//! - Kernel tests gate themselves with [`kernel::require_root`] / [`require_kernel!`] (the CI
//!   rule: skip outside CI when not root, fail in CI).
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use kproxy_testbed::{DEFAULT_PROBE_TIMEOUT, ProbeResult, Proto, Testbed, Where, probe, topology};
//!
//! # fn main() -> kproxy_testbed::Result<()> {
//! let tb = Testbed::new()?;
//! let a = tb.add_pod("a", Where::Node)?;
//! a.serve(&[(Proto::Tcp, 8080), (Proto::Udp, 8080)])?;
//! // … program the dataplane under test in tb.node() …
//! let got = probe(tb.external(), Proto::Tcp, SocketAddr::new(a.ipv4().into(), 8080), DEFAULT_PROBE_TIMEOUT)?;
//! assert_eq!(got, ProbeResult::Answered { backend: "a".into(), seen_source: topology::EXTERNAL_IP_V4.into() });
//! # Ok(())
//! # }
//! ```

mod command;
mod conntrack;
mod echo;
mod error;
pub mod kernel;
mod netns;
mod nft_listing;
mod probe;
mod segment;
mod session;
mod socket;
mod stats;
mod testbed;
pub mod topology;

pub use conntrack::{conntrack_flush, conntrack_list};
pub use echo::EchoServer;
pub use error::{Result, TestbedError};
pub use netns::{NETNS_PREFIX, Netns, NsThread};
pub use nft_listing::nft_listing;
pub use probe::{
    ANSWER_TIMEOUT, DEFAULT_PROBE_TIMEOUT, ProbeOptions, ProbeResult, Proto, Tally, drop_window, probe, probe_many,
    probe_with,
};
pub use segment::{
    SEGMENT_SOURCE_PORT, SegmentTap, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, send_tcp_segments, tcp_segment,
};
pub use session::UdpSession;
pub use stats::{CHI_SQUARE_CRITICAL_P001, chi_square_critical, chi_square_p_value, chi_square_uniform};
pub use testbed::{Pod, PodNetworking, Testbed, TestbedBuilder, Where};
