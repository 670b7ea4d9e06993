//! Settings of the fast path, and the conntrack mark bits it owns.

/// Name of the `inet` table the fast path owns (never shared with a dataplane).
pub const TABLE: &str = "kproxy-accel";
/// Name of the flowtable.
pub const FLOWTABLE: &str = "fastpath";

/// Conntrack mark bits used by the fast path.
///
/// These are bits of the *conntrack entry's* mark (`ct mark`), not of the packet mark
/// (`meta mark`): classification happens once, on the first packet, before DNAT, and must
/// still be visible in `forward` after DNAT and on every later packet of the connection, in
/// both directions — which only the conntrack entry carries. The packet-mark bits of kube-proxy
/// and kproxy (0x4000 masquerade, 0x8000 historical drop; `masqueradeBit` may move them within
/// the low 32 bits of the *packet* mark) live in a different field and cannot collide. The
/// defaults are still chosen outside 0x0000ffff so that a CNI copying packet marks into the
/// conntrack mark with a 16-bit mask (`CONNMARK --save-mark --mask 0xffff`) leaves them alone;
/// the rules only ever OR bits in and test them, never overwrite the mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtMarkBits {
    /// Set in prerouting on connections to an opted-in frontend.
    pub accelerate: u32,
    /// Set in forward when the connection is first handed to the flowtable; its rule's counter
    /// is the number of connections offloaded.
    pub offloaded: u32,
}

impl Default for CtMarkBits {
    fn default() -> Self {
        CtMarkBits { accelerate: 0x0010_0000, offloaded: 0x0020_0000 }
    }
}

/// How the fast path behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccelConfig {
    /// A connection is offloaded once it has exchanged more than this many packets (both
    /// directions; `ct packets > N`). 0 offloads on the first established packet. kproxy's
    /// configuration defaults it to 20 (`--offload-packet-threshold`, as the first KEP and
    /// kindnet): short request/response exchanges finish on the slow path and never pay the
    /// flowtable insert, bulk transfers are offloaded after ~29 kB.
    pub packet_threshold: u32,
    /// Conntrack mark bits.
    pub marks: CtMarkBits,
}

impl Default for AccelConfig {
    fn default() -> Self {
        AccelConfig { packet_threshold: 20, marks: CtMarkBits::default() }
    }
}
