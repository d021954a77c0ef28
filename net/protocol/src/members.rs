//! The member list: which nodes exist, where their shard endpoints listen, and the ring built
//! from them. A node id seen at two different addresses is refused: it means a copied node-id
//! file or a misconfigured member list, and serving under a duplicate id would split a ring slot
//! between two machines.

use std::{collections::BTreeMap, net::SocketAddr};

use crate::{
    node_id::format_uuid,
    ring::{MemberId, Ring, RingConfig, RingError},
};

/// One node as the member list describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node's UUID.
    pub id: u128,
    /// Base address: shard `i` listens on port `port + i`.
    pub addr: SocketAddr,
    /// Number of shards.
    pub shards: u16,
}

impl NodeInfo {
    /// The endpoint address of one of this node's shards.
    pub fn shard_addr(&self, shard: u16) -> SocketAddr {
        let mut a = self.addr;
        a.set_port(self.addr.port().saturating_add(shard));
        a
    }
}

/// Problems with a member list.
#[derive(Debug, PartialEq, Eq)]
pub enum MembershipError {
    /// One node id at two addresses (or with two shard counts).
    DuplicateNode {
        /// The node id.
        id: u128,
        /// The first description seen.
        first: (SocketAddr, u16),
        /// The conflicting one.
        second: (SocketAddr, u16),
    },
    /// Two nodes whose shard port ranges overlap on one host.
    PortClash {
        /// The address both would use.
        addr: SocketAddr,
    },
    /// A node with no shards.
    NoShards(u128),
    /// The ring refused the members.
    Ring(RingError),
}

impl std::fmt::Display for MembershipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MembershipError::DuplicateNode { id, first, second } => write!(
                f,
                "node {} appears twice: at {} with {} shards and at {} with {} shards; each node \
                 needs its own node-id file (delete the copy's node-id to give it a new identity)",
                format_uuid(*id),
                first.0,
                first.1,
                second.0,
                second.1
            ),
            MembershipError::PortClash { addr } => write!(
                f,
                "two nodes would both listen on {addr}: shard ports are base port + shard index, \
                 so give nodes on one host base ports at least their shard count apart"
            ),
            MembershipError::NoShards(id) => write!(f, "node {} has no shards", format_uuid(*id)),
            MembershipError::Ring(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for MembershipError {}

/// A validated member list and its ring.
#[derive(Clone, Debug)]
pub struct Membership {
    nodes: BTreeMap<u128, NodeInfo>,
    ring: Ring,
}

impl Membership {
    /// Validates `nodes` (exact duplicates are merged) and builds the ring at `epoch`.
    pub fn new(
        nodes: impl IntoIterator<Item = NodeInfo>,
        config: RingConfig,
        epoch: u64,
    ) -> Result<Membership, MembershipError> {
        let mut by_id: BTreeMap<u128, NodeInfo> = BTreeMap::new();
        for n in nodes {
            if n.shards == 0 {
                return Err(MembershipError::NoShards(n.id));
            }
            match by_id.get(&n.id) {
                Some(old) if *old != n => {
                    return Err(MembershipError::DuplicateNode {
                        id: n.id,
                        first: (old.addr, old.shards),
                        second: (n.addr, n.shards),
                    })
                }
                _ => {
                    by_id.insert(n.id, n);
                }
            }
        }
        let mut used = BTreeMap::new();
        for n in by_id.values() {
            for s in 0..n.shards {
                if used.insert(n.shard_addr(s), n.id).is_some() {
                    return Err(MembershipError::PortClash {
                        addr: n.shard_addr(s),
                    });
                }
            }
        }
        let members = by_id
            .values()
            .flat_map(|n| (0..n.shards).map(move |shard| MemberId { node: n.id, shard }));
        let ring = Ring::new(members, config, epoch).map_err(MembershipError::Ring)?;
        Ok(Membership { nodes: by_id, ring })
    }

    /// The ring.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// The nodes, by id.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeInfo> {
        self.nodes.values()
    }

    /// The endpoint address of a ring member.
    pub fn addr_of(&self, m: MemberId) -> Option<SocketAddr> {
        let n = self.nodes.get(&m.node)?;
        (m.shard < n.shards).then(|| n.shard_addr(m.shard))
    }

    /// The owner of a page and its endpoint address.
    pub fn route(&self, file_id: u128, page: u64) -> Option<(MemberId, SocketAddr)> {
        let m = self.ring.owner(file_id, page)?;
        Some((m, self.addr_of(m)?))
    }
}

/// Parses a static member file: one node per line, `UUID ADDRESS SHARDS` separated by
/// whitespace (`ADDRESS` is the base `IP:PORT`; shard `i` listens on port + `i`). Blank lines and
/// text after `#` are ignored. Errors name the line.
pub fn parse_member_file(text: &str) -> Result<Vec<NodeInfo>, String> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why: &str| {
            format!(
                "member file line {}: {why}: {raw:?} (expected: UUID IP:PORT SHARDS)",
                i + 1
            )
        };
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 3 {
            return Err(bad("three fields needed"));
        }
        let id = crate::node_id::parse_uuid(f[0]).ok_or_else(|| bad("not a UUID"))?;
        let addr: SocketAddr = f[1].parse().map_err(|_| bad("not an IP:PORT address"))?;
        let shards: u16 = f[2]
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| bad("the shard count must be a number from 1 to 65535"))?;
        out.push(NodeInfo { id, addr, shards });
    }
    if out.is_empty() {
        return Err("the member file lists no nodes".into());
    }
    Ok(out)
}

/// Writes `nodes` in the member-file format (see [`parse_member_file`]).
pub fn format_member_file(nodes: &[NodeInfo]) -> String {
    let mut s = String::from("# pagestore members: UUID  base address  shards\n");
    for n in nodes {
        s.push_str(&format!("{} {} {}\n", format_uuid(n.id), n.addr, n.shards));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_files_round_trip_and_errors_name_the_line() {
        let nodes = vec![
            node(0x1234, "127.0.0.1:7400", 2),
            node(u128::MAX - 5, "[::1]:9000", 16),
        ];
        let text = format_member_file(&nodes);
        assert_eq!(parse_member_file(&text).unwrap(), nodes);
        let with_comments = format!("\n  # comment\n{text}\n# end\n");
        assert_eq!(parse_member_file(&with_comments).unwrap(), nodes);
        for (bad, why) in [
            ("", "no nodes"),
            ("x 127.0.0.1:1 2", "line 1: not a UUID"),
            (
                "00000000-0000-4000-8000-000000000001 localhost:1 2",
                "IP:PORT",
            ),
            (
                "00000000-0000-4000-8000-000000000001 127.0.0.1:1 0",
                "shard count",
            ),
            (
                "\n00000000-0000-4000-8000-000000000001 127.0.0.1:1",
                "line 2: three fields",
            ),
        ] {
            let e = parse_member_file(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    fn node(id: u128, addr: &str, shards: u16) -> NodeInfo {
        NodeInfo {
            id,
            addr: addr.parse().unwrap(),
            shards,
        }
    }

    #[test]
    fn routes_keys_to_the_owning_shard_port() {
        let m = Membership::new(
            [node(1, "127.0.0.1:7000", 4), node(2, "127.0.0.2:7000", 2)],
            RingConfig::default(),
            3,
        )
        .unwrap();
        assert_eq!(m.ring().len(), 6);
        for page in 0..100 {
            let (member, addr) = m.route(42, page).unwrap();
            assert_eq!(Some(member), m.ring().owner(42, page));
            let base = if member.node == 1 {
                "127.0.0.1"
            } else {
                "127.0.0.2"
            };
            assert_eq!(addr.ip().to_string(), base);
            assert_eq!(addr.port(), 7000 + member.shard);
        }
    }

    #[test]
    fn a_node_id_at_two_addresses_is_refused_with_advice() {
        let e = Membership::new(
            [node(7, "127.0.0.1:7000", 2), node(7, "127.0.0.9:7000", 2)],
            RingConfig::default(),
            1,
        )
        .unwrap_err();
        assert!(matches!(e, MembershipError::DuplicateNode { id: 7, .. }));
        let text = e.to_string();
        assert!(
            text.contains("appears twice") && text.contains("node-id"),
            "{text}"
        );
        // The same description twice is just a repeat.
        Membership::new(
            [node(7, "127.0.0.1:7000", 2), node(7, "127.0.0.1:7000", 2)],
            RingConfig::default(),
            1,
        )
        .unwrap();
    }

    #[test]
    fn overlapping_port_ranges_and_empty_nodes_are_refused() {
        let e = Membership::new(
            [node(1, "127.0.0.1:7000", 4), node(2, "127.0.0.1:7002", 2)],
            RingConfig::default(),
            1,
        )
        .unwrap_err();
        assert_eq!(
            e,
            MembershipError::PortClash {
                addr: "127.0.0.1:7002".parse().unwrap()
            }
        );
        assert_eq!(
            Membership::new([node(3, "127.0.0.1:7000", 0)], RingConfig::default(), 1).unwrap_err(),
            MembershipError::NoShards(3)
        );
    }
}
