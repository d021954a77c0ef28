//! `pagestore-client`: what a reader needs to use the cache. This first part is the under
//! storage ([`ufs`]): the mount table over object stores, object versions and file ids. Routing
//! reads to page owners over QUIC, read-ahead and UFS fallback build on it.

pub mod ufs;
