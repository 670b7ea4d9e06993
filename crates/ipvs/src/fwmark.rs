//! Firewall marks of kproxy's firewall-mark virtual services, one per service port and class.
//!
//! A mark is derived from a hash of the service port's name and class, so a restarted kproxy
//! computes the same marks and adopts the kernel's firewall-mark services without touching
//! their connections; a collision (rare in 2^28 marks) moves to the next free mark.

use std::collections::BTreeMap;

use kproxy_plan::ServicePortName;
use kproxy_state::IpFamily;

use crate::render::MarkClass;

type Owner = (IpFamily, ServicePortName, MarkClass);

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

    /// The mark of `(family, name, class)`, allocating it on first use.
    pub fn get(&mut self, family: IpFamily, name: &ServicePortName, class: MarkClass) -> u32 {
        let owner = (family, name.clone(), class);
        if let Some(id) = self.by_owner.get(&owner) {
            return self.base | id;
        }
        let text = format!("{}/{}/{}/{}/{class:?}", name.namespace, name.service, name.port, name.protocol);
        let mut id = 1 + fnv1a(text.bytes()) % self.space;
        while self.by_mark.contains_key(&(family, id)) {
            id = 1 + id % self.space;
        }
        self.by_owner.insert(owner.clone(), id);
        self.by_mark.insert((family, id), owner);
        self.base | id
    }

    /// Frees the marks of a removed service port.
    pub fn release(&mut self, family: IpFamily, name: &ServicePortName) {
        for class in [MarkClass::Cluster, MarkClass::Local] {
            if let Some(id) = self.by_owner.remove(&(family, name.clone(), class)) {
                self.by_mark.remove(&(family, id));
            }
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
    fn marks_are_stable_across_instances_and_distinct_per_class() {
        let mut a = Fwmarks::new(0x1000_0000, 0xf000_0000);
        let mut b = Fwmarks::new(0x1000_0000, 0xf000_0000);
        let (web, db) = (name("web"), name("db"));
        let m1 = a.get(IpFamily::V4, &web, MarkClass::Cluster);
        let _ = b.get(IpFamily::V4, &db, MarkClass::Cluster);
        assert_eq!(b.get(IpFamily::V4, &web, MarkClass::Cluster), m1, "a restart computes the same mark");
        assert_ne!(a.get(IpFamily::V4, &web, MarkClass::Local), m1);
        assert_eq!(m1 & 0xf000_0000, 0x1000_0000);
    }

    #[test]
    fn collisions_move_to_a_free_mark() {
        let mut tiny = Fwmarks::new(0x100, !0x3);
        let marks: Vec<u32> =
            ["a", "b", "c"].iter().map(|s| tiny.get(IpFamily::V4, &name(s), MarkClass::Cluster)).collect();
        let mut unique = marks.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 3, "{marks:x?}");
        tiny.release(IpFamily::V4, &name("a"));
        let again = tiny.get(IpFamily::V4, &name("d"), MarkClass::Cluster);
        assert!(!marks[1..].contains(&again));
    }
}
