//! The job board: progress records of preload jobs (`pagectl load`), as the CLI that runs each
//! job reports them to every node. Nodes only keep and show them (`Jobs` requests, the admin
//! endpoint's `/v1/jobs`); no node coordinates a job. Records live in memory: the most recent
//! [`JobBoard::KEEP`] per node, each within the limits of [`JobRecord::validate`], so a peer
//! cannot make a node hold more than that.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Mutex,
};

use crate::frame::{FrameError, MAX_JOB_RECORDS};
pub use crate::frame::{JobRecord, JobState, MAX_JOB_ID};

/// Job records of one node.
#[derive(Debug, Default)]
pub struct JobBoard {
    /// (update sequence, record), in no particular order; ids are unique.
    records: Mutex<Vec<(u64, JobRecord)>>,
    seq: AtomicU64,
}

impl JobBoard {
    /// Records kept per node; the least recently updated go first.
    pub const KEEP: usize = MAX_JOB_RECORDS;

    /// Stores `record`, replacing the one with the same id. A record beyond the limits of
    /// [`JobRecord::validate`] (an empty id, or one longer than [`MAX_JOB_ID`] bytes, ...) is
    /// refused and changes nothing.
    pub fn report(&self, record: JobRecord) -> Result<(), FrameError> {
        record.validate()?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut r = self.records.lock().unwrap_or_else(|p| p.into_inner());
        match r.iter_mut().find(|(_, old)| old.id == record.id) {
            Some(e) => *e = (seq, record),
            None => r.push((seq, record)),
        }
        if r.len() > Self::KEEP {
            r.sort_by_key(|(s, _)| std::cmp::Reverse(*s));
            r.truncate(Self::KEEP);
        }
        Ok(())
    }

    /// Every record, most recently updated first.
    pub fn records(&self) -> Vec<JobRecord> {
        let mut r: Vec<(u64, JobRecord)> = self
            .records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        r.sort_by_key(|(s, _)| std::cmp::Reverse(*s));
        r.into_iter().map(|(_, v)| v).collect()
    }

    /// [`JobBoard::records`] as a JSON array of objects with the field names of
    /// [`JobRecord`] (`/v1/jobs`).
    pub fn json(&self) -> String {
        // Serializing plain structs of strings, numbers and options cannot fail (non-finite
        // numbers become `null`).
        serde_json::to_string(&self.records()).unwrap_or_else(|_| "[]".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{MAX_JOB_CLIENT_LEN, MAX_JOB_SOURCE_LEN};

    fn job(id: &str, files_done: u64) -> JobRecord {
        JobRecord {
            id: id.to_string(),
            files_done,
            ..JobRecord::default()
        }
    }

    #[test]
    fn keeps_the_latest_record_per_job_and_bounds_the_board() {
        let b = JobBoard::default();
        b.report(job("a", 1)).unwrap();
        b.report(job("b", 5)).unwrap();
        b.report(job("a", 2)).unwrap();
        let r = b.records();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].id, "a");
        assert_eq!(r[0].files_done, 2);
        assert_eq!(r[1].id, "b");
        // Refused records change nothing.
        assert!(b.report(job("", 1)).is_err());
        assert!(b.report(job(&"i".repeat(MAX_JOB_ID + 1), 1)).is_err());
        assert!(b
            .report(JobRecord {
                source: "s".repeat(MAX_JOB_SOURCE_LEN + 1),
                ..job("c", 1)
            })
            .is_err());
        assert!(b
            .report(JobRecord {
                client: "c".repeat(MAX_JOB_CLIENT_LEN + 1),
                ..job("c", 1)
            })
            .is_err());
        assert_eq!(b.records(), r);
        // The longest id is fine.
        b.report(job(&"i".repeat(MAX_JOB_ID), 1)).unwrap();
        for i in 0..250 {
            b.report(job(&format!("j{i}"), i)).unwrap();
        }
        let r = b.records();
        assert_eq!(r.len(), JobBoard::KEEP);
        assert_eq!(r[0].id, "j249");
        assert_eq!(r[JobBoard::KEEP - 1].id, "j150");
        // Updating an old job brings it to the front without growing the board.
        b.report(job("j150", 7)).unwrap();
        let r = b.records();
        assert_eq!(r.len(), JobBoard::KEEP);
        assert_eq!((r[0].id.as_str(), r[0].files_done), ("j150", 7));
        assert_eq!(r[JobBoard::KEEP - 1].id, "j151");
    }

    #[test]
    fn json_has_the_record_field_names() {
        let b = JobBoard::default();
        assert_eq!(b.json(), "[]");
        b.report(JobRecord {
            state: JobState::Done,
            source: "prefix /data".into(),
            first_page_secs: Some(0.5),
            files_total: 3,
            ..job("a", 3)
        })
        .unwrap();
        b.report(job("b", 0)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&b.json()).unwrap();
        let a = &v[1];
        assert_eq!(a["id"], "a");
        assert_eq!(a["state"], "done");
        assert_eq!(a["source"], "prefix /data");
        assert_eq!(a["first_page_secs"], 0.5);
        assert_eq!(a["files_total"], 3);
        assert_eq!(a["files_done"], 3);
        assert_eq!(v[0]["state"], "running");
        assert!(v[0]["first_page_secs"].is_null());
        let mut keys: Vec<&str> = a.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "bytes_done",
                "bytes_loaded",
                "client",
                "elapsed_secs",
                "files_done",
                "files_failed",
                "files_total",
                "first_page_secs",
                "id",
                "pages_loaded",
                "pages_present",
                "resolve_secs",
                "source",
                "state",
                "submitted",
                "updated",
                "verify",
            ]
        );
    }
}
