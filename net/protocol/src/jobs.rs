//! The job board: progress records of preload jobs (`pagectl load`), as the CLI that runs each
//! job reports them to every node. Nodes only keep and show them (`Jobs` requests, the admin
//! endpoint's `/v1/jobs`); no node coordinates a job. Records live in memory: the most recent
//! [`JobBoard::KEEP`] per node.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Mutex,
};

/// Job records of one node.
#[derive(Debug, Default)]
pub struct JobBoard {
    /// (id, update sequence, record), in no particular order.
    records: Mutex<Vec<(String, u64, serde_json::Value)>>,
    seq: AtomicU64,
}

/// Longest job id accepted.
pub const MAX_JOB_ID: usize = 128;

impl JobBoard {
    /// Records kept per node; the least recently updated go first.
    pub const KEEP: usize = 100;

    /// Stores (or replaces) the record in `json`: a JSON object with a string `id`.
    pub fn report(&self, json: &[u8]) -> Result<(), String> {
        let v: serde_json::Value =
            serde_json::from_slice(json).map_err(|e| format!("job record is not JSON: {e}"))?;
        let id = v
            .get("id")
            .and_then(|i| i.as_str())
            .filter(|i| !i.is_empty() && i.len() <= MAX_JOB_ID)
            .ok_or("job record has no string \"id\" of 1 to 128 bytes")?
            .to_string();
        if !v.is_object() {
            return Err("job record is not a JSON object".into());
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut r = self.records.lock().unwrap_or_else(|p| p.into_inner());
        match r.iter_mut().find(|(i, _, _)| *i == id) {
            Some(e) => {
                e.1 = seq;
                e.2 = v;
            }
            None => r.push((id, seq, v)),
        }
        if r.len() > Self::KEEP {
            r.sort_by_key(|(_, s, _)| std::cmp::Reverse(*s));
            r.truncate(Self::KEEP);
        }
        Ok(())
    }

    /// Every record, most recently updated first.
    pub fn records(&self) -> Vec<serde_json::Value> {
        let mut r: Vec<(u64, serde_json::Value)> = self
            .records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(_, s, v)| (*s, v.clone()))
            .collect();
        r.sort_by_key(|(s, _)| std::cmp::Reverse(*s));
        r.into_iter().map(|(_, v)| v).collect()
    }

    /// [`JobBoard::records`] as a JSON array.
    pub fn json(&self) -> String {
        serde_json::Value::Array(self.records()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_latest_record_per_job_and_bounds_the_board() {
        let b = JobBoard::default();
        b.report(br#"{"id":"a","files_done":1}"#).unwrap();
        b.report(br#"{"id":"b","files_done":5}"#).unwrap();
        b.report(br#"{"id":"a","files_done":2}"#).unwrap();
        let r = b.records();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0]["id"], "a");
        assert_eq!(r[0]["files_done"], 2);
        assert!(b.report(b"not json").is_err());
        assert!(b.report(br#"{"files_done":1}"#).is_err());
        assert!(b.report(br#"{"id":""}"#).is_err());
        assert!(b.report(br#"[1,2]"#).is_err());
        for i in 0..250 {
            b.report(format!(r#"{{"id":"j{i}"}}"#).as_bytes()).unwrap();
        }
        let r = b.records();
        assert_eq!(r.len(), JobBoard::KEEP);
        assert_eq!(r[0]["id"], "j249");
        assert_eq!(r[JobBoard::KEEP - 1]["id"], "j150");
    }
}
