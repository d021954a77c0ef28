//! Tests of `ring.rs` (a child module, kept apart so the code reads without them).

use super::*;
use proptest::prelude::*;

/// `nodes` nodes with `shards` shards each; UUIDs spread over all 128 bits.
fn members(nodes: u32, shards: u16) -> Vec<MemberId> {
    (0..nodes)
        .flat_map(|n| {
            let node = u128::from(fmix64(u64::from(n) + 1)) << 64 | u128::from(n);
            (0..shards).map(move |s| MemberId::new(node, s))
        })
        .collect()
}

fn ring(nodes: u32, shards: u16) -> Ring {
    Ring::new(members(nodes, shards), RingConfig::default(), 1).unwrap()
}

/// Key hashes of `n` pages spread over many files, the same in every run.
fn keys(n: u64) -> impl Iterator<Item = u64> {
    (0..n).map(|i| stripe_hash(u128::from(i % 1000) * 0x1_0000_0001, i / 1000))
}

/// Largest share over the mean share.
fn max_share_ratio(ring: &Ring) -> f64 {
    let shares = ring.shares();
    let max = shares.iter().map(|s| s.1).fold(0.0, f64::max);
    max * shares.len() as f64
}

const GOLDEN_NODES: [u128; 3] = [
    0x0000_0000_0000_0000_0000_0000_0000_0001,
    0x1234_5678_9abc_def0_0fed_cba9_8765_4321,
    0xffff_ffff_ffff_ffff_ffff_ffff_ffff_fffe,
];

#[test]
fn fnv1a64_matches_published_vectors() {
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn golden_hashes() {
    assert_eq!(hash64(b""), 0xefd0_1f60_ba99_2926);
    assert_eq!(hash64(b"a"), 0x82a2_a958_a9be_ce5b);
    assert_eq!(hash64(b"pagestore"), 0xefb0_2f00_deee_8b63);
    let m = MemberId::new(GOLDEN_NODES[1], 3);
    assert_eq!(vnode_position(m, 0), 0x2e79_d006_bf54_d155);
    assert_eq!(vnode_position(m, 1), 0xde82_e318_ae25_c996);
    assert_eq!(vnode_position(m, 15), 0x4766_a4fd_5f88_d6bc);
    assert_eq!(stripe_hash(0, 0), 0x515d_260e_3530_5a4c);
    let h = stripe_hash(GOLDEN_NODES[1], 42);
    assert_eq!(h, 0x3a74_432e_9bb2_6d45);
    assert_eq!(probe_position(h, 0), 0x79bd_fc77_c8e2_9a86);
    assert_eq!(probe_position(h, 1), 0xa838_2e29_e943_72d2);
    assert_eq!(probe_position(h, 23), 0x2245_d8a0_00e2_7edc);
    // The byte strings behind the vectors.
    let mut bytes = b"psv1".to_vec();
    bytes.extend_from_slice(&GOLDEN_NODES[1].to_le_bytes());
    bytes.extend_from_slice(&3u16.to_le_bytes());
    bytes.extend_from_slice(&15u32.to_le_bytes());
    assert_eq!(hash64(&bytes), vnode_position(m, 15));
    let mut bytes = b"psk1".to_vec();
    bytes.extend_from_slice(&GOLDEN_NODES[1].to_le_bytes());
    bytes.extend_from_slice(&42u64.to_le_bytes());
    assert_eq!(hash64(&bytes), h);
    // File ids and metadata positions.
    assert_eq!(file_id("/data/a.bin", "v1"), GOLDEN_FILE_ID);
    assert_eq!(path_hash("/data/a.bin"), GOLDEN_PATH_HASH);
    assert_eq!(
        (file_id("/data/a.bin", "v1") >> 64) as u64,
        hash64(b"psf1/data/a.bin\0v1")
    );
    assert_eq!(
        file_id("/data/a.bin", "v1") as u64,
        hash64(b"psf2/data/a.bin\0v1")
    );
    assert_ne!(file_id("/data/a.bin", "v2"), GOLDEN_FILE_ID);
}

const GOLDEN_FILE_ID: u128 = 0x9a250d8fa67cd351b7089ebce875f8a8;
const GOLDEN_PATH_HASH: u64 = 0x0a580ae177b82289;

/// Owners and 3 replicas on the ring of 3 nodes x 2 shards with the
/// default settings; (node number in `GOLDEN_NODES`, shard).
#[test]
fn golden_owners() {
    let all = GOLDEN_NODES
        .iter()
        .flat_map(|&n| (0..2).map(move |s| MemberId::new(n, s)));
    let r = Ring::new(all, RingConfig::default(), 7).unwrap();
    let m = |n: usize, s: u16| MemberId::new(GOLDEN_NODES[n], s);
    let cases: [((u128, u64), [MemberId; 3]); 8] = [
        ((0, 0), [m(0, 1), m(2, 1), m(1, 0)]),
        ((0, 1), [m(1, 0), m(0, 1), m(2, 1)]),
        ((0, 2), [m(0, 1), m(2, 1), m(1, 1)]),
        ((1, 0), [m(1, 1), m(2, 1), m(0, 1)]),
        ((GOLDEN_NODES[1], 42), [m(1, 1), m(0, 1), m(2, 0)]),
        ((u128::MAX, u64::MAX), [m(1, 1), m(2, 0), m(0, 1)]),
        ((7, 1000), [m(0, 0), m(2, 1), m(1, 0)]),
        ((0xdead_beef, 3), [m(2, 1), m(1, 0), m(0, 1)]),
    ];
    for ((file, page), want) in cases {
        assert_eq!(
            r.owner(file, page),
            Some(want[0]),
            "owner of ({file:#x}, {page})"
        );
        assert_eq!(
            r.replicas(file, page, 3),
            want,
            "replicas of ({file:#x}, {page})"
        );
    }
}

#[test]
fn member_order_does_not_matter() {
    let sorted = members(20, 4);
    let mut shuffled = sorted.clone();
    let mut state = 12345u64;
    for i in (1..shuffled.len()).rev() {
        state = fmix64(state.wrapping_add(PROBE_GAMMA));
        shuffled.swap(i, (state % (i as u64 + 1)) as usize);
    }
    assert_ne!(sorted, shuffled);
    let a = Ring::new(sorted, RingConfig::default(), 3).unwrap();
    let b = Ring::new(shuffled.into_iter().rev(), RingConfig::default(), 3).unwrap();
    assert_eq!(a, b);
    for h in keys(20_000) {
        assert_eq!(a.owner_of_hash(h), b.owner_of_hash(h));
        assert_eq!(a.replicas_of_hash(h, 3), b.replicas_of_hash(h, 3));
    }
}

#[test]
fn errors_and_empty_ring() {
    let m = MemberId::new(5, 0);
    assert_eq!(
        Ring::new([m, MemberId::new(6, 0), m], RingConfig::default(), 0),
        Err(RingError::DuplicateMember(m))
    );
    for bad in [
        RingConfig {
            vnodes_per_member: 0,
            ..RingConfig::default()
        },
        RingConfig {
            probes: 0,
            ..RingConfig::default()
        },
        RingConfig {
            probes: MAX_PROBES + 1,
            ..RingConfig::default()
        },
        RingConfig {
            stripe_pages: 0,
            ..RingConfig::default()
        },
    ] {
        assert!(matches!(
            Ring::new([m], bad, 0),
            Err(RingError::InvalidConfig(_))
        ));
    }
    let empty = Ring::new([], RingConfig::default(), 9).unwrap();
    assert!(empty.is_empty());
    assert_eq!((empty.len(), empty.node_count(), empty.epoch()), (0, 0, 9));
    assert_eq!(empty.owner(1, 2), None);
    assert!(empty.replicas(1, 2, 3).is_empty());
    assert!(empty.shares().is_empty());
    assert_eq!(
        empty.with_member_removed(m, 10),
        Err(RingError::UnknownMember(m))
    );
    assert_eq!(
        empty.with_node_removed(5, 10),
        Err(RingError::UnknownNode(5))
    );
    let one = empty.with_member_added(m, 10).unwrap();
    assert_eq!((one.epoch(), one.members()), (10, &[m][..]));
    assert_eq!(one.owner(1, 2), Some(m));
    assert_eq!(one.shares(), vec![(m, 1.0)]);
    assert_eq!(
        one.with_member_added(m, 11),
        Err(RingError::DuplicateMember(m))
    );
    let two = one.with_node_added(7, 2, 11).unwrap();
    assert_eq!(
        two.members(),
        &[m, MemberId::new(7, 0), MemberId::new(7, 1)]
    );
    assert_eq!(two.node_count(), 2);
    assert_eq!(two.with_node_removed(7, 12).unwrap().members(), &[m]);
    assert_eq!(two.with_member_removed(m, 12).unwrap().node_count(), 1);
    assert!(!RingError::TooLarge.to_string().is_empty());
}

#[test]
fn stripes_group_pages_and_spread_files() {
    let cfg = RingConfig {
        stripe_pages: 4,
        ..RingConfig::default()
    };
    let r = Ring::new(members(16, 4), cfg, 0).unwrap();
    for stripe in 0..64u64 {
        let first = r.owner(77, stripe * 4);
        for page in stripe * 4..stripe * 4 + 4 {
            assert_eq!(r.key_hash(77, page), stripe_hash(77, stripe));
            assert_eq!(r.owner(77, page), first);
        }
    }
    // 4,096 stripes of one file reach every core of every node.
    let mut owners: Vec<MemberId> = (0..4096u64).filter_map(|s| r.owner(77, s * 4)).collect();
    owners.sort_unstable();
    owners.dedup();
    assert_eq!(owners.len(), 64);
}

#[test]
fn shares_are_arc_lengths_with_one_probe() {
    let cfg = RingConfig {
        probes: 1,
        ..RingConfig::default()
    };
    let r = Ring::new(members(5, 3), cfg, 0).unwrap();
    let mut arcs = vec![0u128; r.len()];
    let n = r.positions.len();
    for i in 0..n {
        let prev = r.positions[(i + n - 1) % n];
        arcs[r.owners[i] as usize] += u128::from(r.positions[i].wrapping_sub(prev));
    }
    for ((_, share), arc) in r.shares().into_iter().zip(arcs) {
        assert!((share - arc as f64 / 2f64.powi(64)).abs() < 1e-12);
    }
}

/// 64 nodes x 8 shards, 1,000,000 keys, default settings.
#[test]
fn balance_64_nodes_8_shards() {
    let r = ring(64, 8);
    let shares = r.shares();
    let total: f64 = shares.iter().map(|s| s.1).sum();
    assert!((total - 1.0).abs() < 1e-9);
    // Hash space: the design bound is 24/23 = 1.043.
    let ratio = max_share_ratio(&r);
    assert!(ratio <= 1.05, "max share {ratio} x mean");

    // Key counts: each is Binomial(K, share); allow 6 sd per member
    // (probability of a false failure below 512 * 1e-9).
    const K: u64 = 1_000_000;
    let mut count = vec![0u64; r.len()];
    for h in keys(K) {
        let owner = r.owner_point(h).unwrap();
        count[r.owners[owner] as usize] += 1;
    }
    let mean = K as f64 / r.len() as f64;
    for (&c, &(m, share)) in count.iter().zip(&shares) {
        let expect = K as f64 * share;
        let sd = (expect * (1.0 - share)).sqrt();
        assert!(
            (c as f64 - expect).abs() <= 6.0 * sd,
            "{m:?}: {c} keys, expected {expect:.0}"
        );
    }
    // Overall: max <= (max share + 6 sd of a mean-sized count) x mean.
    let max = *count.iter().max().unwrap() as f64;
    assert!(
        max / mean <= ratio + 6.0 / mean.sqrt(),
        "max keys {max} vs mean {mean}"
    );
}

/// Adding or removing one node of 8 shards moves only its keys, at most
/// 1.1x the ideal fraction.
#[test]
fn node_add_and_remove_move_only_that_nodes_keys() {
    const K: u64 = 300_000;
    let base = ring(64, 8);
    let new_node = 0xabcd_ef01_u128 << 96;
    let added = base.with_node_added(new_node, 8, 2).unwrap();
    let victim = base.members()[100].node;
    let removed = base.with_node_removed(victim, 2).unwrap();
    for (from, to, node, ideal) in [
        (&base, &added, new_node, 1.0 / 65.0),
        (&base, &removed, victim, 1.0 / 64.0),
    ] {
        // Exact: the node's hash-space share.
        let big = if to.len() > from.len() { to } else { from };
        let share: f64 = big
            .shares()
            .iter()
            .filter(|s| s.0.node == node)
            .map(|s| s.1)
            .sum();
        assert!(share <= 1.1 * ideal, "node share {share} vs ideal {ideal}");
        // Sampled: count moved keys and check where they went.
        let mut moved = 0u64;
        for h in keys(K) {
            let (a, b) = (from.owner_of_hash(h).unwrap(), to.owner_of_hash(h).unwrap());
            if a != b {
                moved += 1;
                assert!(a.node == node || b.node == node, "{a:?} -> {b:?}");
            }
        }
        let fraction = moved as f64 / K as f64;
        assert!(fraction <= 1.1 * ideal, "moved {fraction} vs ideal {ideal}");
        assert!(fraction >= 0.8 * ideal, "moved {fraction} vs ideal {ideal}");
    }
}

#[test]
fn replicas_are_on_distinct_nodes_and_start_with_owner() {
    let r = ring(10, 4);
    for (i, h) in keys(20_000).enumerate() {
        let n = i % 12;
        let reps = r.replicas_of_hash(h, n);
        assert_eq!(reps.len(), n.min(10));
        if n > 0 {
            assert_eq!(Some(reps[0]), r.owner_of_hash(h));
        }
        for (j, a) in reps.iter().enumerate() {
            assert!(reps[..j].iter().all(|b| b.node != a.node));
        }
    }
}

fn small_ring() -> impl Strategy<Value = (Vec<MemberId>, RingConfig)> {
    let members = prop::collection::btree_set((0u128..6, 0u16..4), 1..12).prop_map(|s| {
        s.into_iter()
            .map(|(n, s)| MemberId::new(n << 100 | n, s))
            .collect()
    });
    let config = (1u32..9, 1u32..9, 1u64..4).prop_map(|(v, k, s)| RingConfig {
        vnodes_per_member: v,
        probes: k,
        stripe_pages: s,
    });
    (members, config)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn prop_owner_and_replicas(
        (members, config) in small_ring(),
        hashes in prop::collection::vec(any::<u64>(), 64),
    ) {
        let r = Ring::new(members, config, 0).unwrap();
        for &h in &hashes {
            let owner = r.owner_of_hash(h).unwrap();
            prop_assert!(r.members().binary_search(&owner).is_ok());
            let reps = r.replicas_of_hash(h, 4);
            prop_assert_eq!(reps.len(), r.node_count().min(4));
            prop_assert_eq!(reps[0], owner);
            for (j, a) in reps.iter().enumerate() {
                prop_assert!(reps[..j].iter().all(|b| b.node != a.node));
            }
        }
        // The bucket index finds the same successor as a full search.
        for &h in &hashes {
            let full = r.positions.partition_point(|&x| x < h) % r.positions.len();
            prop_assert_eq!(r.successor(h), full);
        }
        let total: f64 = r.shares().iter().map(|s| s.1).sum();
        prop_assert!((total - 1.0).abs() < 1e-9);
    }

    #[test]
    fn prop_removal_moves_only_the_removed_members_keys(
        (members, config) in small_ring(),
        pick in any::<prop::sample::Index>(),
        hashes in prop::collection::vec(any::<u64>(), 256),
    ) {
        let r = Ring::new(members, config, 0).unwrap();
        let gone = r.members()[pick.index(r.len())];
        let smaller = r.with_member_removed(gone, 1).unwrap();
        for &h in &hashes {
            let before = r.owner_of_hash(h).unwrap();
            let after = smaller.owner_of_hash(h);
            if before != gone {
                prop_assert_eq!(after, Some(before));
            }
            // Adding it back restores every owner.
            let again = smaller.with_member_added(gone, 2).unwrap();
            prop_assert_eq!(again.owner_of_hash(h), Some(before));
        }
    }
}

/// Key-count spread and movement with the default settings; run with
/// `cargo test --release -- --ignored --nocapture measure`.
#[test]
#[ignore]
fn measure_defaults() {
    let r = ring(64, 8);
    let mut count = vec![0u64; r.len()];
    for h in keys(1_000_000) {
        count[r.owners[r.owner_point(h).unwrap()] as usize] += 1;
    }
    let mean = 1_000_000.0 / r.len() as f64;
    let max = *count.iter().max().unwrap() as f64 / mean;
    let min = *count.iter().min().unwrap() as f64 / mean;
    println!(
        "64x8 keys: max {max:.4} min {min:.4} x mean; max share {:.4}",
        max_share_ratio(&r)
    );
    let mut worst_add = 0.0f64;
    let mut worst_remove = 0.0f64;
    for i in 0..64u32 {
        let node = u128::from(fmix64(u64::from(i) + 1000)) << 64;
        let added = r.with_node_added(node, 8, 2).unwrap();
        let share: f64 = added
            .shares()
            .iter()
            .filter(|s| s.0.node == node)
            .map(|s| s.1)
            .sum();
        worst_add = worst_add.max(share * 65.0);
        let victim = r.members()[i as usize * 8].node;
        let share: f64 = r
            .shares()
            .iter()
            .filter(|s| s.0.node == victim)
            .map(|s| s.1)
            .sum();
        worst_remove = worst_remove.max(share * 64.0);
    }
    println!("64x8 node moves, worst of 64 (x ideal): add {worst_add:.4} remove {worst_remove:.4}");
}

/// Settings survey and lookup speed; run with
/// `cargo test --release -- --ignored --nocapture measure`.
#[test]
#[ignore]
fn measure() {
    for (nodes, shards) in [(64u32, 8u16), (1000, 16)] {
        for (v, k) in [
            (1u32, 1u32),
            (256, 1),
            (1024, 1),
            (1, 21),
            (16, 21),
            (16, 24),
            (32, 24),
        ] {
            let cfg = RingConfig {
                vnodes_per_member: v,
                probes: k,
                stripe_pages: 1,
            };
            let r = Ring::new(members(nodes, shards), cfg, 0).unwrap();
            let shares = r.shares();
            let mean = 1.0 / shares.len() as f64;
            let max = shares.iter().map(|s| s.1).fold(0.0, f64::max) / mean;
            let min = shares.iter().map(|s| s.1).fold(1.0, f64::min) / mean;
            let bytes = r.positions.len() * 12
                + r.bucket_start.len() * 4
                + r.members.len() * std::mem::size_of::<MemberId>();
            let n = 2_000_000u64;
            let t = std::time::Instant::now();
            let mut x = 0u64;
            for i in 0..n {
                x ^= u64::from(r.owner_of_hash(fmix64(i)).unwrap().shard);
            }
            let secs = t.elapsed().as_secs_f64();
            println!(
                "{nodes}x{shards} V={v} k={k}: max {max:.4} min {min:.4} \
                 bytes/member {:.0} lookups/s {:.0} ({x})",
                bytes as f64 / r.len() as f64,
                n as f64 / secs
            );
        }
    }
}

#[test]
fn write_back_versions_keep_their_file_id_across_paths() {
    let tag = crate::writeback::new_tag(42);
    assert_eq!(file_id("/ckpt/.tmp-a", &tag), file_id("/ckpt/a", &tag));
    assert_ne!(
        file_id("/ckpt/a", &tag),
        file_id("/ckpt/a", &crate::writeback::new_tag(43))
    );
    // A store's tag still names path and version together.
    assert_ne!(file_id("/a", "v1"), file_id("/b", "v1"));
    // And a write-back version never shares ids with a store version of the same text.
    assert_ne!(file_id("/a", &tag), file_id("/a", &tag[1..]));
}
