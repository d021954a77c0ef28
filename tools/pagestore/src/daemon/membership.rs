//! Who is in the ring: this node alone, a static member file, or etcd (join, register under a
//! lease, follow changes).

use std::{
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use pagestore_mounts::{
    etcd::{self, ClusterState, Etcd, MemberRecord, RingMode},
    ufs::{FileRoots, MountTable, UfsSource},
};
use pagestore_protocol::{
    frame::{FileId, NodeEntry},
    members::{format_member_file, parse_member_file, Membership, NodeInfo},
    node_id::format_uuid,
    ring::RingConfig,
};
use pagestore_server::node::Node;
use tokio::{runtime::Runtime, task::JoinHandle};

use super::{settings::Resolved, DaemonError};
use crate::admin::{Admin, RingState};

/// The ring's members at start, and the etcd connection and state when membership lives there.
pub(super) struct Joined {
    pub nodes: Vec<NodeInfo>,
    pub etcd: Option<(Arc<Etcd>, ClusterState)>,
}

/// Finds the members: from etcd (joining the cluster; etcd's mount table then replaces
/// `c.mounts`, with this node's credentials put back), the member file, or this node alone.
pub(super) fn join(rt: &Runtime, c: &mut Resolved, me: NodeInfo) -> Result<Joined, DaemonError> {
    if let Some(url) = c.etcd.clone() {
        return join_etcd(rt, c, &url, me);
    }
    let nodes = match &c.members {
        None => vec![me],
        Some(path) => member_file_nodes(path, me)?,
    };
    Ok(Joined { nodes, etcd: None })
}

fn join_etcd(
    rt: &Runtime,
    c: &mut Resolved,
    url: &str,
    me: NodeInfo,
) -> Result<Joined, DaemonError> {
    let e = {
        let _guard = rt.enter();
        Arc::new(Etcd::new(url, &c.etcd_options).map_err(DaemonError::Etcd)?)
    };
    let (mut state, mounts) = rt
        .block_on(etcd_join(&e, c))
        .map_err(|source| match source {
            etcd::EtcdError::Auth(_) => DaemonError::EtcdAuth {
                url: url.to_string(),
                source,
            },
            _ => DaemonError::EtcdJoin {
                url: url.to_string(),
                source,
            },
        })?;
    let own: Vec<(String, String)> = c
        .mounts
        .iter()
        .map(|(p, u)| (p.clone(), pagestore_mounts::ufs::redact(u)))
        .collect();
    if own != mounts {
        tracing::warn!("the mount table in etcd differs from this node's settings; etcd's wins (change it with pagectl mount)");
    }
    for (p, u) in &mounts {
        if !etcd::credentials_in(u).is_empty() {
            tracing::warn!(prefix = %p, "a mount URL in etcd holds credentials: set it again without them (pagectl mount set)");
        }
    }
    // etcd holds no secrets: this node's own credentials go back on its mounts.
    c.mounts = etcd::with_local_credentials(&mounts, &c.mounts);
    let rec = MemberRecord {
        info: me,
        admin: None,
    };
    // This node is about to register: start with it in the ring.
    state.live.insert(me.id, rec.clone());
    state.slots.insert(me.id, rec);
    Ok(Joined {
        nodes: state.ring_nodes(),
        etcd: Some((e, state)),
    })
}

/// Joins the cluster in etcd: sets the ring mode and mount table if this is the first node,
/// and reads the state. Returns the state and the mount table in force.
async fn etcd_join(
    e: &Etcd,
    c: &Resolved,
) -> Result<(ClusterState, Vec<(String, String)>), etcd::EtcdError> {
    let wanted = c.ring_mode.unwrap_or(RingMode::Dynamic);
    let mode = e.init_ring_mode(wanted).await?;
    if c.ring_mode.is_some() && mode != wanted {
        tracing::warn!(
            cluster = mode.as_str(),
            asked = wanted.as_str(),
            "the cluster's ring mode is already set in etcd; using it"
        );
    }
    let mounts = e.init_mounts(&c.mounts).await?;
    Ok((e.state().await?, mounts))
}

/// The members a static member file lists; it must list this node as it runs.
fn member_file_nodes(path: &Path, me: NodeInfo) -> Result<Vec<NodeInfo>, DaemonError> {
    let text = std::fs::read_to_string(path).map_err(|source| DaemonError::MemberFileRead {
        path: path.to_path_buf(),
        source,
    })?;
    let nodes = parse_member_file(&text).map_err(|e| DaemonError::MemberFile {
        path: path.to_path_buf(),
        message: e,
    })?;
    match nodes.iter().find(|n| n.id == me.id) {
        Some(n) if *n == me => Ok(nodes),
        Some(n) => Err(DaemonError::NotInMemberFile {
            path: path.to_path_buf(),
            message: format!(
                "lists this node ({}) at {} with {} shards, but it runs at {} with {} shards; \
                 fix the file or the flags",
                format_uuid(me.id),
                n.addr,
                n.shards,
                me.addr,
                me.shards
            ),
        }),
        None => Err(DaemonError::NotInMemberFile {
            path: path.to_path_buf(),
            message: format!(
                "does not list this node; add the line:\n{}",
                format_member_file(&[me]).lines().nth(1).unwrap_or_default()
            ),
        }),
    }
}

/// The members as the shards hand them to clients.
pub(super) fn node_entries(m: &Membership) -> Vec<NodeEntry> {
    m.nodes()
        .map(|n| NodeEntry {
            id: FileId::from_u128(n.id),
            addr: n.addr.to_string(),
            shards: n.shards,
        })
        .collect()
}

/// What follows etcd while the node runs.
pub(super) struct Registered {
    /// The lease keep-alive, the watch and the task applying its changes.
    pub tasks: Vec<JoinHandle<()>>,
    /// The node's current lease (renewed by the keep-alive).
    pub lease: Arc<AtomicU64>,
}

/// Everything [`register`] needs to follow membership changes.
pub(super) struct Follow<'a> {
    pub node: &'a Arc<Node>,
    pub admin: &'a Arc<Admin>,
    pub source: &'a Arc<UfsSource>,
    pub roots: &'a FileRoots,
    /// This node's own mounts, with their credentials (etcd's table holds none).
    pub local_mounts: &'a [(String, String)],
}

/// Registers this node in etcd under a lease, keeps the lease alive and follows membership
/// changes (applying them to the shards, the admin view and the mount table).
pub(super) fn register(
    rt: &Runtime,
    e: &Arc<Etcd>,
    state: &ClusterState,
    rec: MemberRecord,
    lease_ttl: Duration,
    f: Follow<'_>,
) -> Result<Registered, DaemonError> {
    let l = rt
        .block_on(e.register(&rec, lease_ttl))
        .map_err(DaemonError::Register)?;
    let lease = Arc::new(AtomicU64::new(l));
    let _guard = rt.enter();
    let weak = Arc::downgrade(f.node);
    let lost: etcd::OnLeaseLost = Arc::new(move || {
        let weak = weak.clone();
        Box::pin(async move {
            if let Some(node) = weak.upgrade() {
                suspect_dirty(&node, "its membership lease was lost").await;
            }
        })
    });
    let mut tasks = vec![etcd::keep_registered(
        e.clone(),
        rec,
        lease_ttl,
        lease.clone(),
        lost,
    )];
    let (tx, mut rx) = tokio::sync::watch::channel::<Option<ClusterState>>(None);
    tasks.push(etcd::follow(e.clone(), Some(state.clone()), move |s| {
        tx.send_replace(Some(s.clone()));
        true
    }));
    let (weak, admin, source) = (Arc::downgrade(f.node), f.admin.clone(), f.source.clone());
    let roots = f.roots.clone();
    let local_mounts = f.local_mounts.to_vec();
    tasks.push(rt.spawn(async move {
        while rx.changed().await.is_ok() {
            let Some(s) = rx.borrow_and_update().clone() else {
                continue;
            };
            let Some(node) = weak.upgrade() else {
                return;
            };
            apply_state(&node, &admin, &source, &s, &roots, &local_mounts).await;
        }
    }));
    Ok(Registered { tasks, lease })
}

/// Counts this node's dirty pages as recovered (`Node::suspect_dirty`): the cluster counted
/// it down, and writers may have written newer bytes of them elsewhere meanwhile.
async fn suspect_dirty(node: &Node, why: &str) {
    match node.suspect_dirty().await {
        Ok(0) => {}
        Ok(n) => tracing::warn!(
            versions = n,
            why,
            "this node was counted down: its dirty pages are served only where no other write \
             member holds them"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot mark this node's dirty pages as recovered"),
    }
}

/// Leaves the live set now rather than when the lease runs out (waits at most 2 s for etcd).
pub(super) fn leave(rt: &Runtime, e: &Etcd, lease: &AtomicU64) {
    let l = lease.load(Ordering::Relaxed);
    let revoke = async { tokio::time::timeout(Duration::from_secs(2), e.revoke(l)).await };
    match rt.block_on(revoke) {
        Ok(Ok(())) => {}
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "could not leave etcd; the lease will expire")
        }
        Err(_) => tracing::warn!("etcd did not answer; the lease will expire"),
    }
}

/// Serves under a membership state read from etcd: the shards' rings, the admin view and
/// the mount table (with this node's own credentials, `local_mounts`, put back).
async fn apply_state(
    node: &Node,
    admin: &Admin,
    source: &UfsSource,
    s: &ClusterState,
    roots: &FileRoots,
    local_mounts: &[(String, String)],
) {
    if s.down().contains(&node.node_id()) {
        suspect_dirty(node, "etcd lists it down").await;
    }
    let nodes = s.ring_nodes();
    if nodes.is_empty() {
        tracing::warn!("etcd lists no ring members (not even this node); keeping the last ring");
        return;
    }
    let membership = match Membership::new(nodes, RingConfig::default(), s.revision.max(1)) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring a membership change");
            return;
        }
    };
    if let Err(e) = node
        .set_ring(
            Arc::new(membership.ring().clone()),
            Arc::new(node_entries(&membership)),
        )
        .await
    {
        tracing::warn!(error = %e, "cannot give the shards the new ring");
        return;
    }
    tracing::info!(
        epoch = s.revision,
        nodes = membership.nodes().count(),
        down = s.down().len(),
        mode = s.mode().as_str(),
        "membership changed"
    );
    *admin.ring.write().unwrap_or_else(|p| p.into_inner()) = RingState {
        membership: Arc::new(membership),
        down: s.down(),
        mode: s.mode().as_str(),
    };
    apply_mounts(source, s, roots, local_mounts);
}

/// Replaces the mount table when etcd's differs from the one in use.
fn apply_mounts(
    source: &UfsSource,
    s: &ClusterState,
    roots: &FileRoots,
    local_mounts: &[(String, String)],
) {
    let current = source.table();
    let mut now: Vec<(String, String)> = current
        .mounts()
        .map(|(p, u)| (p.to_string(), u.to_string()))
        .collect();
    let mut wanted = etcd::with_local_credentials(&s.mounts, local_mounts);
    now.sort();
    wanted.sort();
    if !wanted.is_empty() && wanted != now {
        match MountTable::new_confined(&wanted, roots) {
            Ok(t) => {
                source.replace(Arc::new(t));
                tracing::info!(
                    mounts = s.mounts.len(),
                    "mount table changed in etcd; applied"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "ignoring a mount table from etcd that does not open")
            }
        }
    }
}
