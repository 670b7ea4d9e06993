//! Firewall marks of kproxy's firewall-mark virtual services: one per service port that
//! short-circuits local traffic to its cluster endpoints (`externalTrafficPolicy: Local`).
//!
//! A mark is derived from a hash of the service port's name, so a restarted kproxy computes the
//! same marks and adopts the kernel's firewall-mark services without touching their
//! connections; a collision (rare in 2^28 marks) moves to the next free mark.

use std::collections::BTreeMap;

use kproxy_plan::ServicePortName;
use kproxy_state::IpFamily;

type Owner = (IpFamily, ServicePortName);

/// The allocation table.
#[derive(Debug, Clone, Default)]
pub struct Fwmarks {
    base: u32,
    space: u32,
    by_owner: BTreeMap<Owner, u32>,
    by_mark: BTreeMap<(IpFamily, u32), Owner>,
}

fn fnv1a(bytes: impl Iterator<Item = u8>) -> u32 {
    bytes.fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

impl Fwmarks {
    /// Marks are `base | id` with `1 <= id <= !mask`.
    pub fn new(base: u32, mask: u32) -> Self {
        Self { base, space: (!mask).max(1), ..Default::default() }
    }

    /// The mark of `(family, name)`, allocating it on first use.
    pub fn get(&mut self, family: IpFamily, name: &ServicePortName) -> u32 {
        let owner = (family, name.clone());
        if let Some(id) = self.by_owner.get(&owner) {
            return self.base | id;
        }
        // "/Cluster": the text the marks of earlier releases hashed for their short-circuit
        // class, so an upgraded kproxy adopts the kernel's short-circuit services as a restarted
        // one does (their NodePort services, marked otherwise, drain: `keeps_while_connected`).
        let text = format!("{}/{}/{}/{}/Cluster", name.namespace, name.service, name.port, name.protocol);
        let mut id = 1 + fnv1a(text.bytes()) % self.space;
        while self.by_mark.contains_key(&(family, id)) {
            id = 1 + id % self.space;
        }
        self.by_owner.insert(owner.clone(), id);
        self.by_mark.insert((family, id), owner);
        self.base | id
    }

    /// Frees the mark of a removed service port.
    pub fn release(&mut self, family: IpFamily, name: &ServicePortName) {
        if let Some(id) = self.by_owner.remove(&(family, name.clone())) {
            self.by_mark.remove(&(family, id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kproxy_state::Protocol;

    fn name(s: &str) -> ServicePortName {
        ServicePortName { namespace: "default".into(), service: s.into(), port: "http".into(), protocol: Protocol::Tcp }
    }

    #[test]
    fn marks_are_stable_across_instances_and_distinct_per_port() {
        let mut a = Fwmarks::new(0x1000_0000, 0xf000_0000);
        let mut b = Fwmarks::new(0x1000_0000, 0xf000_0000);
        let (web, db) = (name("web"), name("db"));
        let m1 = a.get(IpFamily::V4, &web);
        let _ = b.get(IpFamily::V4, &db);
        assert_eq!(b.get(IpFamily::V4, &web), m1, "a restart computes the same mark");
        assert_ne!(a.get(IpFamily::V4, &db), m1);
        assert_eq!(m1 & 0xf000_0000, 0x1000_0000);
    }

    #[test]
    fn collisions_move_to_a_free_mark() {
        let mut tiny = Fwmarks::new(0x100, !0x3);
        let marks: Vec<u32> = ["a", "b", "c"].iter().map(|s| tiny.get(IpFamily::V4, &name(s))).collect();
        let mut unique = marks.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 3, "{marks:x?}");
        tiny.release(IpFamily::V4, &name("a"));
        let again = tiny.get(IpFamily::V4, &name("d"));
        assert!(!marks[1..].contains(&again));
    }
}
