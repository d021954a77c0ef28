//! Client and store failures as S3 errors. Answers never carry server paths, store URLs or
//! member names: those go to the gateway's log under an incident id that the answer names.

use std::io;

use pagestore_client::Error as ClientError;
use s3s::{S3Error, S3ErrorCode};

use super::multipart::random_id;

/// 400 InvalidArgument with `msg`.
pub(super) fn invalid(msg: String) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidArgument, msg)
}

pub(super) fn client_error(e: ClientError) -> S3Error {
    match e {
        ClientError::NotFound(p) => S3Error::with_message(
            S3ErrorCode::NoSuchKey,
            format!("{p}: the specified key does not exist"),
        ),
        ClientError::IsDir(p) => S3Error::with_message(
            S3ErrorCode::NoSuchKey,
            format!("{p} is a directory (list it with a prefix ending in /)"),
        ),
        ClientError::NotDir(p) => S3Error::with_message(
            S3ErrorCode::NoSuchKey,
            format!("{p}: a parent is not a directory"),
        ),
        ClientError::BadPath(m) => invalid(m),
        ClientError::BadRange(m) => S3Error::with_message(S3ErrorCode::InvalidRange, m),
        // Retryable: the client opens the new version.
        e @ ClientError::Changed(_) => {
            let id = incident();
            tracing::info!(error = %e, incident = %id, "object changed during a read");
            S3Error::with_message(
                S3ErrorCode::ServiceUnavailable,
                format!("the object changed during the request; retry it (incident {id})"),
            )
        }
        // The messages of these name members, store URLs and server paths: logged only.
        e @ ClientError::Unavailable { .. } => {
            let id = incident();
            tracing::warn!(error = %e, incident = %id, "request failed");
            S3Error::with_message(
                S3ErrorCode::ServiceUnavailable,
                format!(
                    "the cluster or the under storage is unavailable; retry later (incident \
                     {id} in the gateway's log)"
                ),
            )
        }
        e @ ClientError::Config { .. } => internal(e.to_string()),
        e @ ClientError::Forbidden(_) => {
            let id = incident();
            tracing::warn!(error = %e, incident = %id, "the cluster refused a request of this gateway (its certificate lacks the role)");
            S3Error::with_message(
                S3ErrorCode::AccessDenied,
                format!("the cache cluster refused this gateway's request (incident {id} in the gateway's log)"),
            )
        }
        ClientError::Precondition(m) => super::cond::precondition_failed(&m),
        ClientError::Exists(p) => S3Error::with_message(
            S3ErrorCode::PreconditionFailed,
            format!("{p}: already exists"),
        ),
        ClientError::NotEmpty(p) => {
            S3Error::with_message(S3ErrorCode::InvalidRequest, format!("{p}: not empty"))
        }
        e @ ClientError::NoSpace(_) => {
            let id = incident();
            tracing::warn!(error = %e, incident = %id, "the cluster cannot take the write now");
            S3Error::with_message(
                S3ErrorCode::SlowDown,
                format!(
                    "the cache cluster cannot take the data now (its write-back buffer, or its record of write-back files, is full); retry later (incident {id})"
                ),
            )
        }
        ClientError::ReadOnly(m) => S3Error::with_message(S3ErrorCode::AccessDenied, m),
        ClientError::Invalid(m) => S3Error::with_message(S3ErrorCode::InvalidArgument, m),
    }
}

/// A short id that ties an error answer to the gateway's log line with the details.
fn incident() -> String {
    random_id()[..12].to_string()
}

/// Whether `e`, or an error it wraps, is the file system running out of space (or the file
/// size limit, or a quota).
fn out_of_space(e: &(dyn std::error::Error + 'static)) -> bool {
    let full = |io: &io::Error| {
        matches!(
            io.raw_os_error(),
            Some(libc::ENOSPC | libc::EFBIG | libc::EDQUOT)
        )
    };
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if full(io) {
                return true;
            }
        }
        cur = err.source();
    }
    // Stores that keep only the text of the system error.
    let text = e.to_string();
    [libc::ENOSPC, libc::EFBIG, libc::EDQUOT]
        .iter()
        .any(|n| text.contains(&format!("(os error {n})")))
}

/// The answer to a write that does not fit: 400 EntityTooLarge (not retried by clients; see
/// docs/SECURITY.md).
fn no_space(detail: &dyn std::fmt::Display) -> S3Error {
    no_space_in(
        detail,
        "the object does not fit in the free space of the under storage",
    )
}

/// [`no_space`], saying where the space ran out.
fn no_space_in(detail: &dyn std::fmt::Display, what: &str) -> S3Error {
    let id = incident();
    tracing::warn!(error = %detail, incident = %id, "write refused: out of space");
    S3Error::with_message(
        S3ErrorCode::EntityTooLarge,
        format!("{what} (incident {id} in the gateway's log)"),
    )
}

/// A failed write to the under storage at `path`, as an S3 error without server details.
pub(super) fn store_error(e: pagestore_client::ufs::UfsError) -> S3Error {
    use pagestore_client::ufs::UfsError;
    match e {
        UfsError::Store(_, object_store::Error::NotImplemented { operation, .. }) => {
            not_implemented(&operation)
        }
        UfsError::Store(
            _,
            object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. },
        ) => super::cond::precondition_failed("the object changed during the request"),
        UfsError::Store(_, ref inner) if out_of_space(inner) => no_space(&e),
        e => client_error(e.into()),
    }
}

/// A failed file operation of the gateway itself (staging), without server details.
pub(super) fn io_failure(what: &str, e: io::Error) -> S3Error {
    if out_of_space(&e) {
        return no_space_in(
            &format!("{what}: {e}"),
            "the gateway's staging directory for multipart uploads is full; complete or abort \
             uploads under way, or retry later",
        );
    }
    internal(format!("{what}: {e}"))
}

/// 501 NotImplemented: the under storage of this bucket cannot do `operation`.
pub(super) fn not_implemented(operation: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::NotImplemented,
        format!("{operation} is not supported by the under storage of this bucket"),
    )
}

/// 409: a key that names a directory (a prefix with objects under it) or lies beneath an
/// object; on a file system both cannot exist.
pub(super) fn conflict(msg: String) -> S3Error {
    let mut e = S3Error::with_message(S3ErrorCode::Custom("ObjectPrefixConflict".into()), msg);
    e.set_status_code(hyper::StatusCode::CONFLICT);
    e
}

/// A failed completion of a (possibly conditional) write of the under storage.
pub(super) fn upload_error(path: &str, e: object_store::Error) -> S3Error {
    match e {
        object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. } => {
            super::cond::precondition_failed("the object changed during the request")
        }
        object_store::Error::NotImplemented { operation, .. } => not_implemented(&operation),
        e => part_error(path, e),
    }
}

/// A failed part or completion of a multipart write to the under storage.
pub(super) fn part_error(path: &str, e: impl std::error::Error + 'static) -> S3Error {
    if out_of_space(&e) {
        return no_space(&format!("{path}: {e}"));
    }
    client_error(ClientError::unavailable(format!("{path}: {e}")))
}

/// A server-side failure: logged with its details (s3s's own log lines are off by default);
/// the client gets an incident id, never server paths or store locations.
pub(super) fn internal(msg: String) -> S3Error {
    let id = incident();
    tracing::warn!(error = %msg, incident = %id, "request failed");
    S3Error::with_message(
        S3ErrorCode::InternalError,
        format!("internal error (incident {id} in the gateway's log)"),
    )
}

pub(super) fn no_such_bucket(bucket: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::NoSuchBucket,
        format!("{bucket}: no such bucket (buckets are the top-level directories, e.g. mounts)"),
    )
}
