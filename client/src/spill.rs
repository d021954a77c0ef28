//! Pages a [`crate::Writer`] keeps in a local file between its sends
//! ([`crate::WriteOptions::spill_dir`]).
//!
//! A writer keeps a few pages open in memory. A random writer touches more: without a spill
//! file, each page it leaves is sent to its write members and read back from them at its next
//! write (a whole page each way for a small write). With one, the page goes to this file
//! instead, later writes to it are written into the file where they fall, and the page is sent
//! once, at the next flush or close. The file has no name (`tempfile::tempfile_in`, as pagefs's
//! staging files), so it goes with the writer (or the process); its holes read as zeros.

use std::{
    collections::BTreeMap,
    fs::File,
    io,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
};

use bytes::BytesMut;

/// A writer's spill file: page `p` lives at `p * page_size`, `pages` says how many bytes of
/// each page it holds.
pub(crate) struct Spill {
    dir: PathBuf,
    page_size: u64,
    file: Option<File>,
    pages: BTreeMap<u64, u32>,
}

impl Spill {
    pub(crate) fn new(dir: &Path, page_size: u64) -> Spill {
        Spill {
            dir: dir.to_path_buf(),
            page_size,
            file: None,
            pages: BTreeMap::new(),
        }
    }

    /// The bytes of `page` held here, if it is held.
    pub(crate) fn held(&self, page: u64) -> Option<u32> {
        self.pages.get(&page).copied()
    }

    /// The file, made (in `dir`, which is made if needed) at the first page spilled.
    fn file(&mut self) -> io::Result<&File> {
        let f = match self.file.take() {
            Some(f) => f,
            None => {
                std::fs::create_dir_all(&self.dir)?;
                tempfile::tempfile_in(&self.dir)?
            }
        };
        Ok(self.file.insert(f))
    }

    /// Keeps `bytes` as the whole content of `page`.
    pub(crate) fn put(&mut self, page: u64, bytes: &[u8]) -> io::Result<()> {
        let at = page * self.page_size;
        self.file()?.write_all_at(bytes, at)?;
        self.pages.insert(page, bytes.len() as u32);
        Ok(())
    }

    /// Writes `data` at `in_page` of the held `page`; a gap after what it held reads as zeros.
    pub(crate) fn write(&mut self, page: u64, in_page: usize, data: &[u8]) -> io::Result<()> {
        let Some(held) = self.held(page) else {
            return Err(io::Error::other(format!("page {page} is not spilled")));
        };
        let base = page * self.page_size;
        let file = self.file()?;
        if in_page > held as usize {
            // Bytes past the page's end may be left from before a truncation.
            let zeros = vec![0u8; in_page - held as usize];
            file.write_all_at(&zeros, base + u64::from(held))?;
        }
        file.write_all_at(data, base + in_page as u64)?;
        let end = (in_page + data.len()) as u32;
        self.pages.insert(page, held.max(end));
        Ok(())
    }

    /// Bytes `[from, to)` of the held `page` (`to` at most what it holds).
    pub(crate) fn read(&mut self, page: u64, from: usize, to: usize) -> io::Result<Vec<u8>> {
        let mut out = vec![0u8; to.saturating_sub(from)];
        let at = page * self.page_size + from as u64;
        self.file()?.read_exact_at(&mut out, at)?;
        Ok(out)
    }

    /// Takes `page` out: its bytes, if it was held.
    pub(crate) fn take(&mut self, page: u64) -> io::Result<Option<BytesMut>> {
        let Some(held) = self.held(page) else {
            return Ok(None);
        };
        let bytes = self.read(page, 0, held as usize)?;
        self.pages.remove(&page);
        let mut b = BytesMut::with_capacity(self.page_size as usize);
        b.extend_from_slice(&bytes);
        Ok(Some(b))
    }

    /// Forgets the pages from `keep` on (a truncation).
    pub(crate) fn drop_from(&mut self, keep: u64) {
        self.pages.retain(|&p, _| p < keep);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pages_written_where_they_fall_read_back_with_zeros_in_gaps() {
        let dir = std::env::temp_dir().join(format!("spill-test-{}", std::process::id()));
        let mut s = Spill::new(&dir, 16);
        assert_eq!(s.held(3), None);
        assert!(s.write(3, 0, b"x").is_err(), "not spilled yet");
        s.put(3, b"abcdef").unwrap();
        s.put(1, b"0123456789abcdef").unwrap();
        s.write(3, 2, b"XY").unwrap();
        assert_eq!(s.held(3), Some(6));
        s.write(3, 10, b"Z").unwrap();
        assert_eq!(s.held(3), Some(11));
        assert_eq!(s.read(3, 0, 11).unwrap(), b"abXYef\0\0\0\0Z");
        // After a truncation a page written again past its end shows zeros, not old bytes.
        let mut p = s.take(3).unwrap().unwrap();
        assert_eq!(&p[..], b"abXYef\0\0\0\0Z");
        assert_eq!(s.held(3), None);
        p.truncate(2);
        s.put(3, &p).unwrap();
        s.write(3, 8, b"W").unwrap();
        assert_eq!(&s.take(3).unwrap().unwrap()[..], b"ab\0\0\0\0\0\0W");
        s.drop_from(1);
        assert_eq!(s.held(1), None);
        assert_eq!(s.take(1).unwrap(), None);
        // The file was unlinked: nothing is left in the directory.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir(&dir).unwrap();
    }
}
