//! The served interfaces' indexes and IPv4 addresses, refreshed periodically so an address
//! added after start-up is picked up without a restart.

use std::collections::HashMap;
use std::sync::RwLock;

use ipnet::Ipv4Net;

use crate::config::LocalAddrs;

pub struct Interfaces {
    names: Vec<String>,
    by_index: RwLock<HashMap<u32, Vec<Ipv4Net>>>,
    index: RwLock<HashMap<String, u32>>,
}

impl Interfaces {
    pub fn new(names: &[String]) -> Interfaces {
        let i = Interfaces { names: names.to_vec(), by_index: RwLock::default(), index: RwLock::default() };
        i.refresh();
        i
    }

    /// Re-reads indexes and addresses of every interface (all of them: relayed requests may
    /// arrive on any, and their server identifier comes from there).
    pub fn refresh(&self) {
        let mut index = HashMap::new();
        let mut by_index: HashMap<u32, Vec<Ipv4Net>> = HashMap::new();
        for (name, net) in LocalAddrs::of_this_host().0 {
            let idx =
                *index.entry(name.clone()).or_insert_with(|| nix::net::if_::if_nametoindex(name.as_str()).unwrap_or(0));
            by_index.entry(idx).or_default().push(net);
        }
        for n in &self.names {
            if !index.contains_key(n)
                && let Ok(idx) = nix::net::if_::if_nametoindex(n.as_str())
            {
                index.insert(n.clone(), idx);
            }
        }
        *self.by_index.write().unwrap() = by_index;
        *self.index.write().unwrap() = index;
    }

    pub fn index_of(&self, name: &str) -> Option<u32> {
        self.index.read().unwrap().get(name).copied()
    }

    /// Whether `ifindex` is one of the served interfaces.
    pub fn is_served(&self, ifindex: u32) -> bool {
        let index = self.index.read().unwrap();
        self.names.iter().any(|n| index.get(n) == Some(&ifindex))
    }

    /// The indexes of the served interfaces known now.
    pub fn served_indexes(&self) -> Vec<u32> {
        let index = self.index.read().unwrap();
        self.names.iter().filter_map(|n| index.get(n).copied()).collect()
    }

    pub fn addrs_of(&self, ifindex: u32) -> Vec<Ipv4Net> {
        self.by_index.read().unwrap().get(&ifindex).cloned().unwrap_or_default()
    }
}
