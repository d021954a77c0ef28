//! `pagestore-mounts`: what nodes and clients share about the world outside the cache.
//!
//! - [`ufs`]: the under storage: the mount table over object stores, object versions and file
//!   ids; also the [`ufs::UfsSource`] a `pagestored` node loads misses through.
//! - [`localfs`]: the store behind `file://` mounts, which never leaves its root directory.
//! - [`etcd`]: membership and the mount table in etcd.
//!
//! It depends on `pagestore-protocol` only: no engine, no glommio.

pub mod etcd;
pub mod localfs;
pub mod ufs;
