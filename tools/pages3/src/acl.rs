//! ACLs, answered as S3 answers them for a bucket whose ACLs are disabled (Object Ownership
//! "bucket owner enforced", what new AWS buckets get): who may do what is the gateway's
//! configuration, not a list kept per object. pages3 has one owner (its one key pair) with
//! full control of every bucket and object; `--anonymous` lets anyone read, as a bucket
//! policy would on S3, not through an ACL.
//!
//! So every ACL reads as the owner's full control (GetBucketAcl, GetObjectAcl), and an ACL can
//! be "set" only to that: the canned `private` or `bucket-owner-full-control`, grant headers or
//! an `AccessControlPolicy` body that give the owner full control and nobody anything else. Any
//! other ACL, on a write (`x-amz-acl`, `x-amz-grant-*` of PutObject, CopyObject,
//! CreateMultipartUpload, CreateBucket) or on PutBucketAcl / PutObjectAcl, is
//! `400 AccessControlListNotSupported`: never taken and ignored, since a client asking for
//! `public-read` means something the gateway would not do.
//!
//! `x-amz-expected-bucket-owner` (and its copy-source form) naming anyone but the owner is
//! `403 AccessDenied`, as S3 answers a request meant for another account's bucket.

use hyper::HeaderMap;
use s3s::{
    dto::{AccessControlPolicy, Grant, Grantee, Grants, Owner, Permission, Type},
    S3Error, S3ErrorCode, S3Result,
};

/// The canonical user id (and display name) of the owner of everything pages3 serves.
pub(super) const OWNER_ID: &str = "pagestore";

/// The operations whose ACL headers S3 reads.
const ACL_OPS: &[&str] = &[
    "PutObject",
    "CopyObject",
    "CreateMultipartUpload",
    "CreateBucket",
    "PutObjectAcl",
    "PutBucketAcl",
];

/// The grant headers, with the permission each gives.
const GRANT_HEADERS: &[(&str, &str)] = &[
    ("x-amz-grant-full-control", Permission::FULL_CONTROL),
    ("x-amz-grant-read", Permission::READ),
    ("x-amz-grant-read-acp", Permission::READ_ACP),
    ("x-amz-grant-write", Permission::WRITE),
    ("x-amz-grant-write-acp", Permission::WRITE_ACP),
];

/// The owner of every bucket and object.
pub(super) fn owner() -> Owner {
    Owner {
        display_name: Some(OWNER_ID.into()),
        id: Some(OWNER_ID.into()),
    }
}

/// The ACL of every bucket and object: the owner's full control.
pub(super) fn grants() -> Grants {
    vec![Grant {
        grantee: Some(Grantee {
            display_name: Some(OWNER_ID.into()),
            email_address: None,
            id: Some(OWNER_ID.into()),
            type_: Type::from_static(Type::CANONICAL_USER),
            uri: None,
        }),
        permission: Some(Permission::from_static(Permission::FULL_CONTROL)),
    }]
}

fn not_supported(what: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::AccessControlListNotSupported,
        format!(
            "The bucket does not allow ACLs ({what}): pages3 gives its one owner ({OWNER_ID}) \
             full control of every bucket and object, and only that ACL (private, or \
             bucket-owner-full-control) can be set; unsigned reads are the gateway's setting \
             (pages3 --anonymous), not an ACL"
        ),
    )
}

/// Whether a request's grants, each told as "is it the owner's full control", are exactly the
/// owner's full control (at least one grant, every one of them the owner's full control).
fn owner_only(grants: impl IntoIterator<Item = bool>) -> bool {
    let mut any = false;
    for g in grants {
        if !g {
            return false;
        }
        any = true;
    }
    any
}

/// For each grantee of a grant header's value (`id="…"`, `emailAddress="…"` or `uri="…"`,
/// comma separated), whether it is the owner.
fn owners(value: &str) -> impl Iterator<Item = bool> + '_ {
    value
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(|g| match g.split_once('=') {
            Some((k, v)) => {
                k.trim().eq_ignore_ascii_case("id") && v.trim().trim_matches('"') == OWNER_ID
            }
            None => false,
        })
}

/// The ACL headers of a request: refused unless they ask for what every ACL here is (or there
/// are none). `op` is the S3 operation's name; other operations' ACL headers mean nothing to
/// S3 and are left alone.
pub(super) fn check_headers(op: &str, headers: &HeaderMap) -> S3Result<()> {
    if !ACL_OPS.contains(&op) {
        return Ok(());
    }
    for v in headers.get_all("x-amz-acl") {
        let v = v.to_str().unwrap_or("").trim();
        if !matches!(v, "private" | "bucket-owner-full-control") {
            return Err(not_supported(&format!("x-amz-acl: {v}")));
        }
    }
    let mut given = Vec::new();
    for (name, perm) in GRANT_HEADERS {
        for v in headers.get_all(*name) {
            let v = v
                .to_str()
                .map_err(|_| not_supported(&format!("{name} is not text")))?;
            given.extend(owners(v).map(|owner| owner && *perm == Permission::FULL_CONTROL));
        }
    }
    if !given.is_empty() && !owner_only(given) {
        return Err(not_supported(
            "grant headers other than the owner's full control",
        ));
    }
    Ok(())
}

/// `x-amz-expected-bucket-owner` and `x-amz-source-expected-bucket-owner`: 403 unless they name
/// the owner.
pub(super) fn check_expected_owner(headers: &HeaderMap) -> S3Result<()> {
    for name in [
        "x-amz-expected-bucket-owner",
        "x-amz-source-expected-bucket-owner",
    ] {
        for v in headers.get_all(name) {
            let v = v.to_str().unwrap_or("").trim();
            if v != OWNER_ID {
                return Err(S3Error::with_message(
                    S3ErrorCode::AccessDenied,
                    format!("{name}: the bucket's owner is {OWNER_ID}, not {v:?}"),
                ));
            }
        }
    }
    Ok(())
}

/// The ACL of a PutBucketAcl or PutObjectAcl: its body, or its canned ACL and grant headers
/// (those checked already by [`check_headers`]). A body must give the owner full control and
/// nobody anything else, and something must be given. S3 refuses a body together with a canned
/// ACL or grant headers; so does this.
pub(super) fn check_put(policy: Option<&AccessControlPolicy>, headers: &HeaderMap) -> S3Result<()> {
    let has_headers = headers.contains_key("x-amz-acl")
        || GRANT_HEADERS.iter().any(|(h, _)| headers.contains_key(*h));
    let Some(policy) = policy else {
        if has_headers {
            return Ok(());
        }
        return Err(S3Error::with_message(
            S3ErrorCode::MissingSecurityHeader,
            "give an ACL: x-amz-acl, x-amz-grant-* headers or an AccessControlPolicy body",
        ));
    };
    if has_headers {
        return Err(S3Error::with_message(
            S3ErrorCode::UnexpectedContent,
            "an ACL body cannot come with x-amz-acl or x-amz-grant-* headers",
        ));
    }
    if let Some(id) = policy.owner.as_ref().and_then(|o| o.id.as_deref()) {
        if id != OWNER_ID {
            return Err(S3Error::with_message(
                S3ErrorCode::AccessDenied,
                format!("the ACL names {id:?} as owner; the owner is {OWNER_ID}"),
            ));
        }
    }
    let given = policy.grants.iter().flatten().map(|g| {
        let owner = matches!(
            &g.grantee,
            Some(Grantee { id: Some(id), uri: None, email_address: None, .. }) if id == OWNER_ID
        );
        owner && g.permission.as_ref().map(|p| p.as_str()) == Some(Permission::FULL_CONTROL)
    });
    if !owner_only(given) {
        return Err(not_supported("grants other than the owner's full control"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    fn code(r: S3Result<()>) -> Option<String> {
        r.err().map(|e| e.code().as_str().to_string())
    }

    #[test]
    fn only_the_owners_full_control_can_be_asked_for() {
        let ok = |p: &[(&'static str, &'static str)]| check_headers("PutObject", &headers(p));
        assert!(ok(&[]).is_ok());
        assert!(ok(&[("x-amz-acl", "private")]).is_ok());
        assert!(ok(&[("x-amz-acl", "bucket-owner-full-control")]).is_ok());
        assert!(ok(&[("x-amz-grant-full-control", "id=\"pagestore\"")]).is_ok());
        for bad in [
            &[("x-amz-acl", "public-read")][..],
            &[("x-amz-acl", "public-read-write")],
            &[("x-amz-acl", "authenticated-read")],
            &[("x-amz-acl", "private"), ("x-amz-acl", "public-read")],
            &[("x-amz-grant-read", "id=\"pagestore\"")],
            &[(
                "x-amz-grant-full-control",
                "id=\"pagestore\", id=\"someone\"",
            )],
            &[("x-amz-grant-full-control", "emailAddress=\"a@b.c\"")],
            &[(
                "x-amz-grant-read",
                "uri=\"http://acs.amazonaws.com/groups/global/AllUsers\"",
            )],
        ] {
            let e = ok(bad).unwrap_err();
            assert_eq!(
                e.code().as_str(),
                "AccessControlListNotSupported",
                "{bad:?}"
            );
            assert_eq!(e.code().status_code(), Some(hyper::StatusCode::BAD_REQUEST));
        }
        // Operations that take no ACL: their ACL headers mean nothing.
        assert!(check_headers("GetObject", &headers(&[("x-amz-acl", "public-read")])).is_ok());
    }

    #[test]
    fn an_expected_owner_other_than_the_owner_is_refused() {
        let h = |v: &'static str| headers(&[("x-amz-expected-bucket-owner", v)]);
        assert!(check_expected_owner(&h("pagestore")).is_ok());
        assert_eq!(
            code(check_expected_owner(&h("123456789012"))).as_deref(),
            Some("AccessDenied")
        );
        let src = headers(&[("x-amz-source-expected-bucket-owner", "x")]);
        assert_eq!(
            code(check_expected_owner(&src)).as_deref(),
            Some("AccessDenied")
        );
    }

    fn body(grants: Grants, owner_id: &str) -> AccessControlPolicy {
        AccessControlPolicy {
            grants: Some(grants),
            owner: Some(Owner {
                display_name: None,
                id: Some(owner_id.into()),
            }),
        }
    }

    #[test]
    fn an_acl_body_must_be_the_owners_full_control() {
        let (none, canned) = (HeaderMap::new(), headers(&[("x-amz-acl", "private")]));
        assert!(check_put(Some(&body(grants(), OWNER_ID)), &none).is_ok());
        assert!(check_put(None, &canned).is_ok());
        assert_eq!(
            code(check_put(None, &none)).as_deref(),
            Some("MissingSecurityHeader")
        );
        assert_eq!(
            code(check_put(Some(&body(grants(), OWNER_ID)), &canned)).as_deref(),
            Some("UnexpectedContent")
        );
        assert_eq!(
            code(check_put(Some(&body(grants(), "someone")), &none)).as_deref(),
            Some("AccessDenied")
        );
        assert_eq!(
            code(check_put(Some(&body(vec![], OWNER_ID)), &none)).as_deref(),
            Some("AccessControlListNotSupported")
        );
        let mut more = grants();
        more.push(Grant {
            grantee: Some(Grantee {
                display_name: None,
                email_address: None,
                id: None,
                type_: Type::from_static(Type::GROUP),
                uri: Some("http://acs.amazonaws.com/groups/global/AllUsers".into()),
            }),
            permission: Some(Permission::from_static(Permission::READ)),
        });
        assert_eq!(
            code(check_put(Some(&body(more, OWNER_ID)), &none)).as_deref(),
            Some("AccessControlListNotSupported")
        );
        let mut read_only = grants();
        read_only[0].permission = Some(Permission::from_static(Permission::READ));
        assert_eq!(
            code(check_put(Some(&body(read_only, OWNER_ID)), &none)).as_deref(),
            Some("AccessControlListNotSupported")
        );
    }
}
